"""Every notebook in notebooks/: stored clean, executed by papermill with its gates passing,
exported to offline HTML; a failing gate fails `workbench run`, naming notebook, cell and gate.
New notebooks are picked up automatically."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from workbench.cli import main
from workbench.runner import PLOTLY_MIMETYPE, NotebookError, parse_parameters

from .conftest import NOTEBOOKS, ROOT

ids = [p.stem for p in NOTEBOOKS]


def test_there_are_notebooks():
    assert {"first_divergence", "tour"} <= set(ids)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_stored_notebook_is_clean(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    for i, c in enumerate(nb.cells, 1):
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None, \
                f"{path.name} cell {i} has outputs: run scripts/strip_notebooks.py"
    assert not nb.metadata.get("widgets"), f"{path.name} stores widget state: strip it"
    params = {p.name: p for p in parse_parameters(nb, path=path)}  # exactly one parameters cell
    assert params["interactive"].type == "bool" and params["interactive"].default is False
    assert all(p.help for p in params.values()), f"{path.name}: every parameter needs a '# help'"
    last = nb.cells[-1]
    assert last.cell_type == "code" and "assert_gates()" in last.source, "the last cell asserts the gates"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_notebook_runs_and_gates_pass(suite, path):
    (r,) = [r for r in suite.notebooks if r.notebook == f"notebooks/{path.name}"]
    assert r.status == "passed", r.describe()
    assert r.gates and all(g["passed"] for g in r.gates)
    executed = nbformat.read(suite.out / r.ipynb, as_version=4)
    figures = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs
               if PLOTLY_MIMETYPE in o.get("data", {})]
    assert figures, "every notebook shows at least one figure"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_html_report_is_offline(suite, path):
    page = (suite.out / f"{path.stem}.html").read_text()
    assert page.count('<script src="plotly.min.js"></script>') == 1
    assert page.count("Plotly.newPlot") >= 1 and "plotly-graph-div" in page
    assert len(page) < 2_000_000, "plotly.js must not be inlined"
    for cdn in ("cdn.plot.ly", "cdnjs.cloudflare.com", "cdn.jsdelivr.net", "unpkg.com"):
        assert cdn not in page


def test_results_and_index(suite):
    res = json.loads((suite.out / "results.json").read_text())
    assert res["ok"] and {n["notebook"] for n in res["notebooks"]} == {f"notebooks/{p.name}" for p in NOTEBOOKS}
    assert (suite.out / "plotly.min.js").stat().st_size > 1_000_000
    index = (suite.out / "index.html").read_text()
    for p in NOTEBOOKS:
        assert f"href='{p.stem}.html'" in index


def test_failing_gate_fails_the_run(tmp_path, capsys):
    nb = ROOT / "notebooks" / "tour.ipynb"
    rc = main(["run", str(nb), "-p", "max_rel_l2", "1e-12", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1
    src = nbformat.read(nb, as_version=4)
    last, gates_cell = len(src.cells), next(
        i for i, c in enumerate(src.cells, 1) if "nb.gate(\"tensor_rel_l2\"" in c.source)
    assert f"FAILED  notebooks/tour.ipynb: cell {last} raised GateError: 1 of 2 gate(s) failed: tensor_rel_l2" in err
    assert f"gate 'tensor_rel_l2' (recorded in cell {gates_cell})" in err
    res = json.loads((tmp_path / "results.json").read_text())
    (r,) = res["notebooks"]
    assert not res["ok"] and r["status"] == "failed" and r["failed_gates"] == ["tensor_rel_l2"]
    assert r["parameters"] == {"max_rel_l2": 1e-12}
    assert (r["error"]["cell"], r["error"]["gates"], r["error"]["stage"]) == (last, ["tensor_rel_l2"], "execute")
    page = (tmp_path / "tour.html").read_text()  # the report of a failed run is still written
    assert "Plotly.newPlot" in page and "GateError" in page


def test_interactive_run_saves_widget_state(tmp_path):
    from workbench.runner import run_notebooks

    res = run_notebooks([ROOT / "notebooks" / "first_divergence.ipynb"], parameters={"interactive": True},
                        out=tmp_path, log=lambda *_: None)
    assert res.ok, res.notebooks[0].describe()
    executed = nbformat.read(tmp_path / "first_divergence.ipynb", as_version=4)
    state = executed.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    assert any(m["model_name"] == "DropdownModel" for m in state.values())
    page = (tmp_path / "first_divergence.html").read_text()
    assert "application/vnd.jupyter.widget-state+json" in page


def test_an_html_export_failure_loses_no_other_result(tmp_path, monkeypatch):
    # one notebook whose report cannot be exported is an error in results.json and index.html;
    # the other notebooks' results are written as usual
    import workbench.runner as runner
    from workbench.runner import execute

    real = execute.export_html

    def flaky(nb, dest, **kw):
        if Path(dest).stem == "tour":
            raise RuntimeError("nbconvert broke")
        return real(nb, dest, **kw)

    monkeypatch.setattr(execute, "export_html", flaky)
    nbs = [ROOT / "notebooks" / "tour.ipynb", ROOT / "notebooks" / "paired_stats.ipynb"]
    res = runner.run_notebooks(nbs, out=tmp_path / "out", log=lambda *a: None)
    by = {r.notebook.split("/")[-1]: r for r in res.notebooks}
    assert by["tour.ipynb"].status == "error" and "HTML export" in by["tour.ipynb"].error["ename"]
    failure = by["tour.ipynb"].failure()  # the typed error carries notebook, stage and cell
    assert isinstance(failure, runner.NotebookFailure) and failure.stage == "export" and failure.cell is None
    assert [f.notebook for f in res.failures] == [by["tour.ipynb"].notebook]
    assert by["paired_stats.ipynb"].status == "passed" and by["paired_stats.ipynb"].html
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [n["status"] for n in saved["notebooks"]] == ["error", "passed"]
    assert (tmp_path / "out" / "index.html").exists() and not (tmp_path / "out" / "tour.html").exists()


@pytest.mark.parametrize("path", NOTEBOOKS, ids=ids)
def test_papermill_reads_every_parameter(path, caplog):
    # papermill's own parser (used for its "unknown parameter" warning and --help-notebook) must
    # see every declared parameter: one '=' per line, annotations it can read ("Optional[int]")
    from papermill.translators import PythonTranslator

    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    with caplog.at_level("WARNING", logger="papermill"):
        seen = {p.name for p in PythonTranslator.inspect(cell)}
    assert seen == {p.name for p in parse_parameters(nb, path=path)}
    assert not [r for r in caplog.records if "Unable to parse" in r.getMessage()]


def test_replay_notebook_replays_the_captured_qsa_decode(tmp_path):
    """The replay notebook on the bundled candidate's sparse decode (36 recorded cases): the
    fp16-probability change is found from the tensors, moves every case closer to the capture, and
    the metadata expectation (the one knob the recorded policies differ in) agrees."""
    from .helpers import run_one

    r = run_one(tmp_path, "replay", capture=str(ROOT / "captures/candidate"), control=str(ROOT / "captures/control"),
                op="qsa", output="o", backends=["torch"],  # knobs: the qsa adapter's own
                expect="metadata", reproduce_quantile=0.5)
    assert r.status == "passed", r.describe()
    assert r.findings[0]["data"]["reproduced"] == "prob_dtype=fp16"
    moved = next(f for f in r.findings if "closer_cases" in f["data"])
    assert (moved["data"]["closer_cases"], moved["data"]["cases"]) == (36, 36)
    assert {"reproduced_by", "blamed_knob"} <= {g["name"] for g in r.gates}
    # fp32 reassociation in the replay flips an fp16 rounding of P in a few cases: most reproduce
    # to fp32 noise, which the finding counts
    assert " cases; worst " in r.findings[0]["text"]


def _timing_notebook(folder: Path, stem: str) -> Path:
    # a notebook that records when it ran (wall clock) and passes one gate
    nb = nbformat.v4.new_notebook()
    p = nbformat.v4.new_code_cell('out: str = ""  # where to write the times\nseconds: float = 2.0')
    p.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell(f"# {stem}"), p,
                nbformat.v4.new_code_cell(
                    "import json, time\nfrom workbench import notebook as nb\nt0 = time.time()\n"
                    "time.sleep(seconds)\n"
                    f"open(out + '/{stem}.json', 'w').write(json.dumps([t0, time.time()]))\n"
                    "nb.gate('ran', 1, 1, op='==')\nnb.assert_gates()")]
    path = folder / f"{stem}.ipynb"
    nbformat.write(nb, path)
    return path


def test_jobs_run_notebooks_at_once_and_keep_their_order(tmp_path):
    from workbench.runner import run_notebooks

    nbs = [_timing_notebook(tmp_path, s) for s in ("c_first", "a_second", "b_third")]
    times = tmp_path / "times"
    times.mkdir()
    res = run_notebooks(nbs, parameters={"out": str(times)}, out=tmp_path / "out", jobs=3, html_reports=False,
                        log=lambda *a: None)
    assert res.ok, res.failures
    assert [Path(r.notebook).stem for r in res.notebooks] == ["c_first", "a_second", "b_third"]
    spans = [json.loads((times / f"{s}.json").read_text()) for s in ("c_first", "a_second", "b_third")]
    assert max(s[0] for s in spans) < min(s[1] for s in spans), f"the notebooks did not overlap: {spans}"
    saved = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [Path(n["notebook"]).stem for n in saved["notebooks"]] == ["c_first", "a_second", "b_third"]
    # one at a time when asked: no two runs overlap
    res = run_notebooks(nbs[:2], parameters={"out": str(times), "seconds": 0.5}, out=tmp_path / "out1", jobs=1,
                        html_reports=False, log=lambda *a: None)
    assert res.ok
    spans = sorted(json.loads((times / f"{s}.json").read_text()) for s in ("c_first", "a_second"))
    assert spans[0][1] <= spans[1][0]
    with pytest.raises(NotebookError, match="jobs must be at least 1"):
        run_notebooks(nbs, out=tmp_path / "out2", jobs=0)
    assert not (tmp_path / "out2").exists()
