"""The run of notebooks, one straight pipeline per notebook::

    execute (papermill) -> collect gates and the first error -> judge -> export HTML -> result

Each stage that finds the notebook failed raises :class:`~workbench.errors.NotebookFailure`
(notebook, 1-based cell of the stored notebook, gates, stage); the pipeline turns it into the
notebook's ``error`` and status, writes what it has, and goes on with the next notebook. Errors
that stop everything before a notebook runs (a missing notebook, an unknown parameter) are
NotebookError / ParameterError, raised before anything runs.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from workbench._atomic import atomic_write_json
from workbench.errors import NotebookError, NotebookFailure
from workbench.notebook import FINDING_MIMETYPE, GATE_MIMETYPE, repo_root
from workbench.runner.kernel import kernel_env
from workbench.runner.params import _bind, find_notebooks, parse_parameters, read_notebook
from workbench.runner.report import (capture_inputs, copy_plotly_js, export_html, export_pdf, provenance, summary_html,
                                     write_index)

__all__ = ["NotebookResult", "RunResult", "default_jobs", "run_notebooks"]


@dataclass
class NotebookResult:
    """What one notebook run produced; ``error`` names the failing cell (1-based, as in the
    source notebook), the stage and the gates whose check is false (``failed_gates``)."""

    notebook: str
    status: str  # "passed" | "failed" (a cell raised or a gate is false) | "error" (kernel, export)
    parameters: dict = field(default_factory=dict)
    gates: list = field(default_factory=list)
    findings: list = field(default_factory=list)  # what the notebook found, in words (nb.finding)
    error: dict | None = None
    ipynb: str | None = None
    html: str | None = None
    pdf: str | None = None
    seconds: float = 0.0

    @property
    def failed_gates(self) -> list[dict]:
        return [g for g in self.gates if not g["passed"]]

    def failure(self) -> NotebookFailure | None:
        """The failure as a typed error (None when the notebook passed), e.g. to raise it."""
        if self.status == "passed":
            return None
        e = self.error or {}
        return NotebookFailure(self._headline(), notebook=self.notebook, cell=e.get("cell"), ename=e.get("ename", ""),
                               evalue=e.get("evalue") or "", source=e.get("source", ""),
                               gates=[g["name"] for g in self.failed_gates], stage=e.get("stage", "execute"),
                               execution_count=e.get("execution_count"))

    def _headline(self) -> str:
        e = self.error or {}
        first = (e.get("evalue") or "").splitlines()[0] if e.get("evalue") else ""
        return f"{self.notebook}: cell {e.get('cell', '?')} raised {e.get('ename', '?')}: {first}"

    def describe(self) -> str:
        if self.status == "passed":
            return f"passed  {self.notebook}: {len(self.gates)} gate(s) ({self.seconds:.1f} s)"
        e = self.error or {}
        lines = [f"FAILED  {self._headline()}"]
        if e.get("source"):
            lines.append(f"        cell {e.get('cell')} begins: {e['source']}")
        for g in self.failed_gates:
            lines.append(f"        gate {g['name']!r} (recorded in cell {g.get('cell', '?')}): "
                         f"{g['value']!r} {g['op']} {g['threshold']!r} is false")
        return "\n".join(lines)


@dataclass
class RunResult:
    out: Path
    notebooks: list[NotebookResult]

    @property
    def ok(self) -> bool:
        return all(r.status == "passed" for r in self.notebooks)

    @property
    def failures(self) -> list[NotebookFailure]:
        """One typed error per notebook that did not pass."""
        return [f for r in self.notebooks if (f := r.failure()) is not None]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "out": str(self.out),
                "notebooks": [asdict(r) | {"failed_gates": [g["name"] for g in r.failed_gates]}
                              for r in self.notebooks]}


# -- the stages ------------------------------------------------------------------------------------

def _source_cell_number(src_nb, executed_nb, exec_index: int) -> int:
    """1-based position in the stored notebook of executed cell ``exec_index`` (papermill inserts
    an injected-parameters cell and error banners; cell ids survive)."""
    cid = executed_nb.cells[exec_index].get("id")
    for i, c in enumerate(src_nb.cells):
        if cid is not None and c.get("id") == cid:
            return i + 1
    return exec_index + 1


def _execute(path: Path, dest: Path, params: dict, kernel: str, timeout: float, rel: str) -> None:
    """papermill; a failure outside any cell (kernel death, a timeout) is a NotebookFailure."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    try:
        pm.execute_notebook(str(path), str(dest), parameters=params, kernel_name=kernel, language="python",
                            cwd=str(path.parent),
                            execution_timeout=timeout, progress_bar=False, log_output=False)
    except PapermillExecutionError:
        pass  # a cell raised: the executed notebook holds the error output, _collect finds it
    except Exception as e:
        raise NotebookFailure(f"{rel}: the kernel failed: {type(e).__name__}: {e}", notebook=rel,
                              ename=type(e).__name__, evalue=str(e), stage="execute") from e


def _collect(src_nb, executed_nb, rel: str) -> tuple[list[dict], list[dict], NotebookFailure | None]:
    """The gates the notebook recorded (the last record of each name), its findings and its first
    cell error."""
    gates: dict[str, dict] = {}
    found: list[dict] = []
    error = None
    for i, cell in enumerate(executed_nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = out.get("data", {})
            if FINDING_MIMETYPE in data:
                found.append({**data[FINDING_MIMETYPE], "cell": _source_cell_number(src_nb, executed_nb, i)})
            if GATE_MIMETYPE in data:
                g = dict(data[GATE_MIMETYPE])
                g["cell"] = _source_cell_number(src_nb, executed_nb, i)
                gates.pop(g["name"], None)
                gates[g["name"]] = g
            if out.get("output_type") == "error" and error is None:
                first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
                n = _source_cell_number(src_nb, executed_nb, i)
                error = NotebookFailure(f"{rel}: cell {n} raised {out.get('ename')}", notebook=rel, cell=n,
                                        ename=out.get("ename") or "", evalue=out.get("evalue") or "",
                                        source=first[:120], execution_count=cell.get("execution_count"))
    return list(gates.values()), found, error


def _judge(gates: list[dict], error: NotebookFailure | None, rel: str) -> None:
    """A cell error, a false gate nothing asserted, or no gate at all: the notebook failed."""
    false = [g["name"] for g in gates if not g["passed"]]
    if error is not None:
        error.gates = false
        raise error
    if false:
        raise NotebookFailure(f"{rel}: gate(s) {false} failed without assert_gates()", notebook=rel,
                              ename="GateError", evalue="gate(s) failed without assert_gates()", gates=false,
                              stage="gates", fix="end the notebook with nb.assert_gates()")
    if not gates:
        raise NotebookFailure(f"{rel}: the notebook recorded no gate", notebook=rel, ename="GateError",
                              evalue="the notebook recorded no gate", stage="gates",
                              fix="record at least one check with nb.gate(name, value, threshold)")


def _export(executed_nb, page: Path, title: str, rel: str, summary: str | None = None, show_code: bool = False) -> Path:
    try:
        return export_html(executed_nb, page, title=title, summary=summary, show_code=show_code)
    except Exception as e:  # one report that cannot be exported must not lose the others
        page.unlink(missing_ok=True)
        raise NotebookFailure(f"{rel}: HTML export failed: {type(e).__name__}: {e}", notebook=rel,
                              ename=f"HTML export: {type(e).__name__}", evalue=str(e) or type(e).__name__,
                              stage="export") from e


def _export_pdf(page: Path, rel: str) -> Path:
    try:
        return export_pdf(page)
    except Exception as e:  # the HTML report stands; the PDF is said to be missing
        raise NotebookFailure(f"{rel}: PDF export failed: {e}", notebook=rel, ename=f"PDF export: {type(e).__name__}",
                              evalue=str(e), stage="export", fix=getattr(e, "fix", None) or "") from e


def _run_one(path: Path, src_nb, params: dict, *, out: Path, kernel: str, timeout: float, html_reports: bool,
             rel: str, show_code: bool = False, pdf: bool = False, context: dict | None = None) -> NotebookResult:
    dest = out / f"{path.stem}.ipynb"
    t0 = time.perf_counter()
    gates: list[dict] = []
    found: list[dict] = []
    executed = page = printed = None
    failure: NotebookFailure | None = None
    try:
        _execute(path, dest, params, kernel, timeout, rel)
    except NotebookFailure as f:
        failure = f
    if dest.exists():
        import nbformat
        executed = nbformat.read(dest, as_version=4)
        gates, found, cell_error = _collect(src_nb, executed, rel)
        if failure is None:
            try:
                _judge(gates, cell_error, rel)
            except NotebookFailure as f:
                failure = f
    seconds = time.perf_counter() - t0
    status = _status(failure)
    if html_reports and executed is not None:
        ctx = context or {}
        effective = {**{p.name: p.default for p in parse_parameters(src_nb, path=path)}, **params}
        summary = summary_html(notebook=rel, status=status, ipynb=dest.name, parameters=_jsonable(effective),
                               inputs=capture_inputs(effective, ctx.get("resolve")), findings=found, gates=gates,
                               provenance=ctx.get("provenance") or {})
        try:
            page = _export(executed, out / f"{path.stem}.html", path.stem, rel, summary=summary, show_code=show_code)
            if pdf:
                printed = _export_pdf(page, rel)
        except NotebookFailure as f:
            failure = f
    status = _status(failure)
    return NotebookResult(notebook=rel, status=status, parameters=_jsonable(params), gates=gates, findings=found,
                          error=None if failure is None else failure.to_dict(),
                          ipynb=dest.name if executed is not None else None,
                          html=page.name if page else None, pdf=printed.name if printed else None,
                          seconds=round(seconds, 2))


def _status(failure: NotebookFailure | None) -> str:
    if failure is None:
        return "passed"
    if failure.stage == "export" or (failure.stage == "execute" and failure.cell is None):
        return "error"  # the run or its report broke, not the notebook's checks
    return "failed"  # a cell raised or a gate is false


def run_notebooks(notebooks: Sequence[str | os.PathLike] | None = None, *,
                  parameters: Sequence[tuple[str, Any]] | Mapping[str, Any] = (),
                  out: str | os.PathLike = "reports", timeout: float = 300,
                  html_reports: bool = True, show_code: bool = False, jobs: int | None = None,
                  pdf: bool = False, log=print) -> RunResult:
    """Execute notebooks with papermill and write reports, results.json and index.html to ``out``.

    Parameters
    ----------
    notebooks: paths; default every ``notebooks/*.ipynb`` of the repository
    parameters: (NAME, VALUE) pairs or a mapping; NAME may be ``STEM.NAME`` to target one
        notebook; values in text are converted to the declared type
    out: the report folder (created)
    timeout: seconds allowed to each cell
    html_reports: also export each executed notebook to offline HTML (opening with its question,
        inputs, provenance, findings and gates; code folded unless ``show_code``)
    pdf: also print each HTML report to ``<name>.pdf`` with headless Chromium (figures as drawn;
        :func:`~workbench.runner.report.export_pdf`)
    jobs: notebooks run at once, each in its own kernel (default: the machine's cores, at most 4);
        results keep the notebooks' order whatever finishes first

    Raises NotebookError / ParameterError before anything runs; failures of a run are reported
    in the result (``.ok``, ``.failures``: one NotebookFailure each), never raised.
    """
    root = repo_root()
    if notebooks and not (root / "captures").is_dir():  # run from elsewhere: the notebooks' own checkout
        root = repo_root(Path(notebooks[0]).resolve().parent)
    paths = [Path(p).resolve() for p in notebooks] if notebooks else [p.resolve() for p in find_notebooks(root)]
    if not paths:
        raise NotebookError(f"no notebooks to run under {root / 'notebooks'}", file=root / "notebooks",
                            fix="give notebook paths, or run from the workbench checkout")
    stems = [p.stem for p in paths]
    if len(set(stems)) != len(stems):
        raise NotebookError(f"two notebooks share a name: {stems}", fix="run them separately (--out)")
    sources = {p: read_notebook(p) for p in paths}
    declared = {p: parse_parameters(sources[p], path=p) for p in paths}
    given = list(parameters.items()) if isinstance(parameters, Mapping) else list(parameters)
    bound = _bind(paths, declared, given)
    if pdf and not html_reports:
        raise NotebookError("a PDF is printed from the HTML report: pdf needs html_reports", key="--pdf",
                            fix="drop --no-html (or --pdf)")
    if pdf:
        from workbench.runner.report import find_chromium
        if find_chromium() is None:
            raise NotebookError("no Chromium to print the PDFs with", key="--pdf",
                                fix="install it (apt-get install chromium) or set WORKBENCH_CHROMIUM to its path")
    jobs = default_jobs(len(paths)) if jobs is None else int(jobs)
    if jobs < 1:
        raise NotebookError(f"jobs must be at least 1, not {jobs}", key="jobs", fix="pass --jobs 1 or more")

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    context = {}
    if html_reports:
        copy_plotly_js(out)
        from workbench.notebook import resolve  # the notebooks' own reading of a parameter path; the
        # reports are written inside kernel_env, which sets the root and working directory it reads
        context = {"provenance": provenance(root), "resolve": resolve}
    from concurrent.futures import ThreadPoolExecutor

    from workbench.progress import counter

    bar = counter(desc="notebooks", unit="notebook", total=len(paths)) if len(paths) > 1 and log is print else None
    say = bar.write if bar is not None else log

    def one(p: Path) -> NotebookResult:
        rel = _rel(p, root)
        say(f"running {rel} " + " ".join(f"{k}={v!r}" for k, v in bound[p].items()))
        r = _run_one(p, sources[p], bound[p], out=out, kernel=kernel, timeout=timeout,
                     html_reports=html_reports, rel=rel, show_code=show_code, pdf=pdf, context=context)
        say(r.describe())
        if bar is not None:
            bar.update(1)
        return r

    try:
        with kernel_env(root) as kernel:
            if jobs == 1 or len(paths) == 1:
                results = [one(p) for p in paths]
            else:  # papermill waits on its kernel: threads suffice, each notebook has its own process
                with ThreadPoolExecutor(max_workers=min(jobs, len(paths)), thread_name_prefix="notebook") as pool:
                    results = list(pool.map(one, paths))
    finally:
        if bar is not None:
            bar.close()
    res = RunResult(out=out, notebooks=results)
    atomic_write_json(out / "results.json", json.loads(json.dumps(res.to_dict(), default=str)), indent=1)
    write_index(res)
    return res


def default_jobs(n_notebooks: int) -> int:
    """Notebooks run at once by default: one per core, at most 4 (each kernel holds its own
    torch and captures), never more than there are notebooks."""
    return max(1, min(n_notebooks, os.cpu_count() or 1, 4))


def _jsonable(d: dict) -> dict:
    return json.loads(json.dumps(d, default=str))


def _rel(p: Path, root: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)
