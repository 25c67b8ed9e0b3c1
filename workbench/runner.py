"""Run parameterized notebooks headless: papermill, offline HTML reports, gates as a CI verdict.

``workbench run`` (see :func:`run_notebooks`) executes each notebook with papermill on a kernel
of the current interpreter, with the notebook's own folder as working directory (as in
JupyterLab; paths in parameters are resolved against the repository by
:func:`workbench.notebook.resolve`) and a per-cell timeout. It writes into the output folder::

    <name>.ipynb     the executed notebook (outputs, injected parameters, saved widget state)
    <name>.html      the same as a page that works offline
    plotly.min.js    one copy of plotly.js, referenced by every page
    results.json     every notebook's status, parameters, error and gates
    index.html       a summary linking every report

Parameters are declared in the one cell tagged ``parameters``, one per line::

    control: str = "captures/control"  # the reference run, relative to the repository
    max_aa_rel_l2: float = 1e-5  # A/A noise ceiling
    interactive: bool = False  # show the widget explorer

Unknown names are refused, values given as text (``-p NAME VALUE``) are converted to the declared
type. plotly >= 6.1 emits only ``application/vnd.plotly.v1+json`` under a kernel, which nbconvert
drops; :class:`PlotlyToHTML` turns each such output into a div and a ``Plotly.newPlot`` call.
"""

from __future__ import annotations

import ast
import contextlib
import html
import io
import json
import os
import shutil
import sys
import tempfile
import time
import tokenize
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from workbench._atomic import atomic_write_json
from workbench.errors import WorkbenchError
from workbench.notebook import GATE_MIMETYPE, ROOT_ENV, repo_root

__all__ = ["Parameter", "NotebookResult", "RunResult", "ParameterError", "NotebookError",
           "parse_parameters", "convert_value", "find_notebooks", "run_notebooks",
           "export_html", "PlotlyToHTML", "PLOTLY_MIMETYPE", "KERNEL_NAME"]

PLOTLY_MIMETYPE = "application/vnd.plotly.v1+json"
KERNEL_NAME = "workbench-python"
PLOTLY_JS = "plotly.min.js"
_TYPES = ("int", "float", "str", "bool", "list[int]", "list[float]", "list[str]")


class ParameterError(WorkbenchError, ValueError):
    """A notebook parameter is unknown, malformed or of the wrong type."""


class NotebookError(WorkbenchError):
    """A notebook cannot be run (missing, not a notebook, no parameters cell)."""


# -- parameters ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Parameter:
    """One line ``name: type = value  # help`` of a notebook's parameters cell."""

    name: str
    type: str
    default: Any
    help: str = ""
    optional: bool = False  # the type ends in "| None"


def _parameters_cells(nb) -> list[int]:
    return [i for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]


def parse_parameters(nb, *, path: str | os.PathLike | None = None) -> list[Parameter]:
    """The declared parameters of a notebook (an nbformat node or a path).

    Raises :class:`NotebookError` when there is not exactly one cell tagged ``parameters`` and
    :class:`ParameterError` naming the line that does not read ``name: type = value  # help``.
    """
    if not hasattr(nb, "cells"):
        path = nb
        nb = _read(nb)
    cells = _parameters_cells(nb)
    if len(cells) != 1:
        raise NotebookError(
            f"a notebook needs exactly one code cell tagged 'parameters', found {len(cells)}",
            file=path, fix="tag the cell of 'name: type = value  # help' lines with 'parameters' "
                           "(JupyterLab: property inspector -> cell tags)")
    src = nb.cells[cells[0]].source
    params = []
    for lineno, line in enumerate(src.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        params.append(_parse_line(line, lineno, path))
    names = [p.name for p in params]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ParameterError(f"parameter(s) declared twice: {dup}", file=path,
                             fix="declare each parameter once")
    return params


def _parse_line(line: str, lineno: int, path) -> Parameter:
    fix = "write one parameter per line as 'name: type = value  # help' with type one of " \
          f"{list(_TYPES)} (optionally '| None')"
    helptext, code = "", line
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.COMMENT:
                helptext = tok.string.lstrip("#").strip()
                code = line[: tok.start[1]]
                break
        tree = ast.parse(code.strip())
    except (SyntaxError, tokenize.TokenError) as e:
        raise ParameterError(f"parameters cell line {lineno} is not valid Python: {line.strip()!r} ({e.msg if hasattr(e, 'msg') else e})",
                             file=path, fix=fix) from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.AnnAssign) \
            or not isinstance(tree.body[0].target, ast.Name) or tree.body[0].value is None:
        raise ParameterError(f"parameters cell line {lineno} is not 'name: type = value': {line.strip()!r}",
                             file=path, fix=fix)
    node = tree.body[0]
    typ = ast.unparse(node.annotation).replace(" ", "")
    optional = False
    if typ.endswith("|None"):
        typ, optional = typ[: -len("|None")], True
    elif typ.startswith("None|"):
        typ, optional = typ[len("None|"):], True
    elif typ.startswith("Optional[") and typ.endswith("]"):
        typ, optional = typ[len("Optional["):-1], True
    if typ not in _TYPES:
        raise ParameterError(f"parameter {node.target.id!r} (line {lineno}) has unsupported type {typ!r}",
                             file=path, key=node.target.id, fix=fix)
    try:
        default = ast.literal_eval(node.value)
    except ValueError:
        raise ParameterError(f"parameter {node.target.id!r} (line {lineno}): the default must be a "
                             f"literal, got {ast.unparse(node.value)!r}", file=path,
                             key=node.target.id, fix="compute derived values in a later cell") from None
    p = Parameter(name=node.target.id, type=typ, default=default, help=helptext, optional=optional)
    convert_value(p, default, path=path)  # the default must have the declared type
    return p


def convert_value(param: Parameter, value: Any, *, path=None) -> Any:
    """``value`` (text from the command line, or a YAML/Python value) as ``param``'s type."""

    def bad(why: str = ""):
        return ParameterError(
            f"parameter {param.name!r} expects {param.type}{' | None' if param.optional else ''}, "
            f"got {value!r}" + (f" ({why})" if why else ""), file=path, key=param.name,
            fix=f"pass a {param.type}" + (" or 'none'" if param.optional else "")
            + (f"; help: {param.help}" if param.help else ""))

    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null")
                         and param.type != "str"):
        if param.optional:
            return None
        raise bad("not optional")
    if isinstance(value, str) and param.type == "str" and param.optional and value.strip() == "None":
        return None
    if param.type.startswith("list["):
        inner = Parameter(param.name, param.type[5:-1], None, param.help)
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                try:
                    value = ast.literal_eval(text)
                except (ValueError, SyntaxError):
                    raise bad("not a list literal") from None
            else:
                value = [v.strip() for v in text.split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise bad("not a list")
        return [convert_value(inner, v, path=path) for v in value]
    if param.type == "bool":
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            low = value.strip().lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise bad("use true/false")
    if param.type == "int":
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                raise bad() from None
        raise bad()
    if param.type == "float":
        if isinstance(value, bool):
            raise bad()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value.strip())
            except ValueError:
                raise bad() from None
        raise bad()
    # str
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise bad()


def _read(path):
    import nbformat

    p = Path(path)
    if not p.is_file():
        raise NotebookError(f"no such notebook: {p}", file=p,
                            fix="give a path to an .ipynb file, or run without arguments for all of notebooks/")
    try:
        return nbformat.read(p, as_version=4)
    except Exception as e:  # nbformat raises several unrelated types
        raise NotebookError(f"not a readable notebook: {e}", file=p, fix="check the file is .ipynb JSON") from None


def find_notebooks(root: str | os.PathLike | None = None) -> list[Path]:
    """Every ``notebooks/*.ipynb`` of the repository (checkpoints excluded), sorted."""
    base = Path(root) if root else repo_root()
    return sorted(p for p in (base / "notebooks").glob("*.ipynb") if not p.name.startswith("."))


def _bind(notebooks: Sequence[Path], declared: Mapping[Path, list[Parameter]],
          given: Sequence[tuple[str, Any]]) -> dict[Path, dict[str, Any]]:
    """Assign given parameters (NAME or STEM.NAME) to the notebooks that declare them."""
    out: dict[Path, dict[str, Any]] = {nb: {} for nb in notebooks}
    for name, value in given:
        stem, dot, pname = name.rpartition(".")
        targets = [nb for nb in notebooks if not dot or nb.stem == stem]
        if dot and not targets:
            raise ParameterError(f"parameter {name!r} names notebook {stem!r}, which is not being run",
                                 key=name, fix="run that notebook or drop the prefix; running: "
                                 + ", ".join(nb.stem for nb in notebooks))
        hit = False
        for nb in targets:
            by_name = {p.name: p for p in declared[nb]}
            if pname in by_name:
                out[nb][pname] = convert_value(by_name[pname], value, path=nb)
                hit = True
        if not hit:
            choices = sorted({p.name for nb in targets for p in declared[nb]})
            raise ParameterError(
                f"unknown parameter {pname!r}: not declared by "
                + ", ".join(nb.name for nb in targets), key=name,
                fix=f"use one of {choices}")
    return out


# -- kernel ----------------------------------------------------------------------------------------

@contextlib.contextmanager
def _kernel_env(root: Path):
    """A kernelspec named KERNEL_NAME that runs this very interpreter, visible through a temporary
    JUPYTER_PATH entry, and WORKBENCH_ROOT for the kernel (it inherits the environment)."""
    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", ROOT_ENV, "PYDEVD_DISABLE_FILE_VALIDATION")}
    with tempfile.TemporaryDirectory(prefix="workbench-kernel-") as tmp:
        kdir = Path(tmp) / "kernels" / KERNEL_NAME
        kdir.mkdir(parents=True)
        spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": f"workbench ({sys.executable})", "language": "python",
                "metadata": {"debugger": False, "supported_encryption": ["curve"]}}
        (kdir / "kernel.json").write_text(json.dumps(spec, indent=1))
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [tmp, saved["JUPYTER_PATH"]]))
        os.environ[ROOT_ENV] = str(root)
        os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # frozen-modules warning on stderr
        try:
            yield KERNEL_NAME
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


# -- HTML export -----------------------------------------------------------------------------------

def _plotly_div(spec: dict) -> str:
    import plotly.io as pio

    fig = {"data": spec.get("data", []), "layout": spec.get("layout", {}),
           "frames": spec.get("frames", [])}
    cfg = spec.get("config") or {}
    return pio.to_html(fig, include_plotlyjs=False, full_html=False, validate=False,
                       config=cfg or None)


def _preprocessor_base():
    from nbconvert.preprocessors import Preprocessor

    return Preprocessor


class PlotlyToHTML(_preprocessor_base()):
    """Give every plotly mimetype output a text/html rendering (a div + ``Plotly.newPlot``) that
    uses the page's one shared plotly.js; nbconvert would otherwise drop the figure silently."""

    def preprocess_cell(self, cell, resources, index):
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if PLOTLY_MIMETYPE in data and "text/html" not in data:
                data["text/html"] = _plotly_div(data[PLOTLY_MIMETYPE])
                resources.setdefault("plotly_figures", 0)
                resources["plotly_figures"] += 1
        return cell, resources


_TEMPLATE = r"""{%- extends 'lab/index.html.j2' -%}
{#- offline: no require.js (it would capture plotly.js as an AMD module), no MathJax or mermaid from a CDN -#}
{%- block html_head_js_requirejs -%}{%- endblock html_head_js_requirejs -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block html_head_js -%}
{{ super() }}
<script src="{{ resources.plotly_js_url }}"></script>
{%- endblock html_head_js -%}
"""


def export_html(nb, dest: str | os.PathLike, *, plotly_js_url: str = PLOTLY_JS,
                title: str | None = None) -> Path:
    """Write ``nb`` (node or path) as an offline HTML page referencing ``plotly_js_url``."""
    import jinja2
    from nbconvert import HTMLExporter

    if not hasattr(nb, "cells"):
        nb = _read(nb)
    exporter = HTMLExporter(template_name="lab", template_file="workbench.html.j2",
                            extra_loaders=[jinja2.DictLoader({"workbench.html.j2": _TEMPLATE})])
    exporter.register_preprocessor(PlotlyToHTML(), enabled=True)
    resources = {"plotly_js_url": plotly_js_url, "metadata": {"name": title or Path(dest).stem}}
    body, _ = exporter.from_notebook_node(nb, resources=resources)
    dest = Path(dest)
    dest.write_text(body, encoding="utf-8")
    return dest


def copy_plotly_js(out: Path) -> Path:
    """Ship the installed plotly package's plotly.min.js once into the report folder."""
    import plotly

    src = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    dst = out / PLOTLY_JS
    if not dst.exists() or dst.stat().st_size != src.stat().st_size:
        shutil.copyfile(src, dst)
    return dst


# -- running ---------------------------------------------------------------------------------------

@dataclass
class NotebookResult:
    """What one notebook run produced; ``error`` names the failing cell (1-based, as in the
    source notebook) and ``failed_gates`` the gates whose check is false."""

    notebook: str
    status: str  # "passed" | "failed" | "error"
    parameters: dict = field(default_factory=dict)
    gates: list = field(default_factory=list)
    error: dict | None = None
    ipynb: str | None = None
    html: str | None = None
    seconds: float = 0.0

    @property
    def failed_gates(self) -> list[dict]:
        return [g for g in self.gates if not g["passed"]]

    def describe(self) -> str:
        if self.status == "passed":
            return f"passed  {self.notebook}: {len(self.gates)} gate(s) ({self.seconds:.1f} s)"
        e = self.error or {}
        lines = [f"FAILED  {self.notebook}: cell {e.get('cell', '?')} raised {e.get('ename', '?')}: "
                 f"{(e.get('evalue') or '').splitlines()[0] if e.get('evalue') else ''}"]
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

    def to_dict(self) -> dict:
        return {"ok": self.ok, "out": str(self.out),
                "notebooks": [asdict(r) | {"failed_gates": [g["name"] for g in r.failed_gates]}
                              for r in self.notebooks]}


def _source_cell_number(src_nb, executed_nb, exec_index: int) -> int:
    """1-based position in the stored notebook of executed cell ``exec_index`` (papermill inserts
    an injected-parameters cell and error banners; cell ids survive)."""
    cid = executed_nb.cells[exec_index].get("id")
    for i, c in enumerate(src_nb.cells):
        if cid is not None and c.get("id") == cid:
            return i + 1
    return exec_index + 1


def _collect(src_nb, executed_nb) -> tuple[list[dict], dict | None]:
    gates: dict[str, dict] = {}
    error = None
    for i, cell in enumerate(executed_nb.cells):
        for out in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = out.get("data", {})
            if GATE_MIMETYPE in data:
                g = dict(data[GATE_MIMETYPE])
                g["cell"] = _source_cell_number(src_nb, executed_nb, i)
                gates.pop(g["name"], None)
                gates[g["name"]] = g
            if out.get("output_type") == "error" and error is None:
                first = next((ln for ln in cell.source.splitlines() if ln.strip()), "")
                error = {"cell": _source_cell_number(src_nb, executed_nb, i),
                         "execution_count": cell.get("execution_count"),
                         "ename": out.get("ename"), "evalue": out.get("evalue"),
                         "source": first[:120]}
    return list(gates.values()), error


def run_notebooks(notebooks: Sequence[str | os.PathLike] | None = None, *,
                  parameters: Sequence[tuple[str, Any]] | Mapping[str, Any] = (),
                  out: str | os.PathLike = "reports", timeout: float = 300,
                  html_reports: bool = True, log=print) -> RunResult:
    """Execute notebooks with papermill and write reports, results.json and index.html to ``out``.

    Parameters
    ----------
    notebooks: paths; default every ``notebooks/*.ipynb`` of the repository
    parameters: (NAME, VALUE) pairs or a mapping; NAME may be ``STEM.NAME`` to target one
        notebook; values in text are converted to the declared type
    out: the report folder (created)
    timeout: seconds allowed to each cell
    html_reports: also export each executed notebook to offline HTML

    Raises NotebookError / ParameterError before anything runs; failures of a run are reported
    in the result (``.ok``), never raised.
    """
    import nbformat
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    root = repo_root()
    paths = [Path(p).resolve() for p in notebooks] if notebooks else [p.resolve() for p in find_notebooks(root)]
    if not paths:
        raise NotebookError(f"no notebooks to run under {root / 'notebooks'}", file=root / "notebooks",
                            fix="give notebook paths, or run from the workbench checkout")
    stems = [p.stem for p in paths]
    if len(set(stems)) != len(stems):
        raise NotebookError(f"two notebooks share a name: {stems}", fix="run them separately (--out)")
    sources = {p: _read(p) for p in paths}
    declared = {p: parse_parameters(sources[p], path=p) for p in paths}
    given = list(parameters.items()) if isinstance(parameters, Mapping) else list(parameters)
    bound = _bind(paths, declared, given)

    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if html_reports:
        copy_plotly_js(out)
    results = []
    with _kernel_env(root) as kernel:
        for p in paths:
            rel = _rel(p, root)
            dest = out / f"{p.stem}.ipynb"
            t0 = time.perf_counter()
            log(f"running {rel} " + " ".join(f"{k}={v!r}" for k, v in bound[p].items()))
            status = "passed"
            try:
                pm.execute_notebook(str(p), str(dest), parameters=bound[p], kernel_name=kernel,
                                    cwd=str(p.parent), execution_timeout=timeout,
                                    progress_bar=False, log_output=False)
            except PapermillExecutionError:
                status = "failed"
            except Exception as e:  # kernel death, timeouts outside cells, ...
                status = "error"
                err = {"cell": None, "ename": type(e).__name__, "evalue": str(e), "source": ""}
            seconds = time.perf_counter() - t0
            executed = nbformat.read(dest, as_version=4) if dest.exists() else None
            gates, error = _collect(sources[p], executed) if executed is not None else ([], None)
            if status == "error" and error is None:
                error = err
            if status == "passed" and any(not g["passed"] for g in gates):
                status = "failed"  # a gate failed but nothing asserted it: still a failure
                error = {"cell": None, "ename": "GateError", "evalue": "gate(s) failed without assert_gates()",
                         "source": ""}
            if status == "passed" and not gates:
                status = "failed"
                error = {"cell": None, "ename": "GateError", "evalue": "the notebook recorded no gate",
                         "source": ""}
            page = None
            if html_reports and executed is not None:
                try:
                    page = export_html(executed, out / f"{p.stem}.html", title=p.stem)
                except Exception as e:  # one report that cannot be exported must not lose the others
                    (out / f"{p.stem}.html").unlink(missing_ok=True)
                    status = "error"
                    error = {"cell": None, "ename": f"HTML export: {type(e).__name__}",
                             "evalue": str(e) or type(e).__name__, "source": ""}
            r = NotebookResult(notebook=rel, status=status, parameters=_jsonable(bound[p]),
                               gates=gates, error=error, ipynb=dest.name if executed is not None else None,
                               html=page.name if page else None, seconds=round(seconds, 2))
            log(r.describe())
            results.append(r)
    res = RunResult(out=out, notebooks=results)
    atomic_write_json(out / "results.json", json.loads(json.dumps(res.to_dict(), default=str)), indent=1)
    _write_index(res)
    return res


def _jsonable(d: dict) -> dict:
    return json.loads(json.dumps(d, default=str))


def _rel(p: Path, root: Path) -> str:
    try:
        return str(p.relative_to(root))
    except ValueError:
        return str(p)


def _write_index(res: RunResult) -> Path:
    rows = []
    for r in res.notebooks:
        color = "#1a7f37" if r.status == "passed" else "#cf222e"
        gate_cells = " ".join(
            f"<span title='{html.escape(str(g['value']))} {html.escape(g['op'])} "
            f"{html.escape(str(g['threshold']))}' style='color:{'#1a7f37' if g['passed'] else '#cf222e'}'>"
            f"{html.escape(g['name'])}</span>" for g in r.gates)
        err = ""
        if r.status != "passed" and r.error:
            err = html.escape(f"cell {r.error.get('cell')}: {r.error.get('ename')}: "
                              f"{(r.error.get('evalue') or '').splitlines()[0] if r.error.get('evalue') else ''}")
        link = f"<a href='{html.escape(r.html)}'>{html.escape(r.notebook)}</a>" if r.html else html.escape(r.notebook)
        nb = f" <a href='{html.escape(r.ipynb)}'>.ipynb</a>" if r.ipynb else ""
        rows.append(f"<tr><td>{link}{nb}</td><td style='color:{color};font-weight:bold'>{r.status}</td>"
                    f"<td>{sum(g['passed'] for g in r.gates)}/{len(r.gates)}</td><td>{gate_cells}</td>"
                    f"<td>{err}</td><td>{r.seconds:.1f} s</td></tr>")
    verdict = "all notebooks passed" if res.ok else "FAILED"
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>workbench reports</title>
<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}}
td,th{{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}}</style></head>
<body><h1>workbench reports: {verdict}</h1>
<table><tr><th>notebook</th><th>status</th><th>gates</th><th>gate names</th><th>error</th><th>time</th></tr>
{''.join(rows)}
</table><p><a href="results.json">results.json</a></p></body></html>
"""
    path = res.out / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def load_params_file(path: str | os.PathLike) -> list[tuple[str, Any]]:
    """A YAML mapping NAME: VALUE (or STEM: {NAME: VALUE}) as (NAME, VALUE) pairs."""
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ParameterError(f"cannot read parameters file: {e}", file=p,
                             fix="write a YAML mapping of NAME: VALUE") from None
    if not isinstance(data, dict):
        raise ParameterError("a parameters file must hold a mapping", file=p,
                             fix="write NAME: VALUE lines, or NOTEBOOK: {NAME: VALUE}")
    pairs = []
    for k, v in data.items():
        if isinstance(v, dict):
            pairs += [(f"{k}.{n}", x) for n, x in v.items()]
        else:
            pairs.append((str(k), v))
    return pairs
