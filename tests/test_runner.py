"""workbench.runner: parameters cell parsing, type conversion, binding, offline HTML export, CLI
refusals (no kernel is started here; tests/notebooks/ executes the real notebooks)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from workbench.cli import main
from workbench.runner import (PLOTLY_MIMETYPE, NotebookError, Parameter, ParameterError, _bind,
                              convert_value, export_html, load_params_file, parse_parameters)

PARAMS = '''\
# comment lines and blank lines are allowed

capture: str = "captures/control"  # a path # with a hash
layer: int = 3  # the layer
tol: float = 1e-3
flag: bool = False  # a flag
maybe: int | None = None  # optional
names: list[str] = ["a", "b"]  # a list
'''


def _nb(params: str | None = PARAMS, *extra_params: str):
    cells = [new_markdown_cell("# t")]
    for src in ([params] if params is not None else []) + list(extra_params):
        c = new_code_cell(src)
        c.metadata["tags"] = ["parameters"]
        cells.append(c)
    cells.append(new_code_cell("x = 1"))
    return new_notebook(cells=cells)


def test_parse_parameters():
    ps = {p.name: p for p in parse_parameters(_nb())}
    assert list(ps) == ["capture", "layer", "tol", "flag", "maybe", "names"]
    assert ps["capture"] == Parameter("capture", "str", "captures/control", "a path # with a hash")
    assert ps["tol"].default == 1e-3 and ps["tol"].help == ""
    assert ps["maybe"].optional and ps["maybe"].default is None
    assert ps["names"].default == ["a", "b"]


@pytest.mark.parametrize("cells,match", [
    ((None,), "exactly one code cell tagged 'parameters', found 0"),
    ((PARAMS, "y: int = 1"), "found 2"),
], ids=["none", "two"])
def test_parameters_cell_count(cells, match):
    with pytest.raises(NotebookError, match=match):
        parse_parameters(_nb(*cells))


@pytest.mark.parametrize("line,match", [
    ("x = 1", "is not 'name: type = value'"),
    ("x: int", "is not 'name: type = value'"),
    ("x: dict = {}", "unsupported type 'dict'"),
    ("x: int = 1 +", "not valid Python"),
    ("x: str = os.getcwd()", "the default must be a literal"),
    ("x: int = 'three'", "expects int"),
    ("x: int = 1\nx: int = 2", "declared twice"),
], ids=["no-annotation", "no-value", "type", "syntax", "call", "default-type", "duplicate"])
def test_bad_parameter_lines(line, match):
    with pytest.raises(ParameterError, match=match):
        parse_parameters(_nb(line))


@pytest.mark.parametrize("typ,optional,text,want", [
    ("int", False, "7", 7), ("int", False, 7.0, 7), ("float", False, "1e-3", 1e-3), ("float", False, 2, 2.0),
    ("bool", False, "true", True), ("bool", False, "0", False), ("bool", False, "No", False),
    ("str", False, "none", "none"), ("str", False, 3, "3"), ("int", True, "none", None),
    ("str", True, None, None), ("list[int]", False, "1,2, 3", [1, 2, 3]),
    ("list[float]", False, "[0.5, 1]", [0.5, 1.0]), ("list[str]", False, ["a"], ["a"]),
], ids=lambda x: repr(x))
def test_convert_value(typ, optional, text, want):
    got = convert_value(Parameter("p", typ, None, optional=optional), text)
    assert got == want and type(got) is type(want)


@pytest.mark.parametrize("typ,text", [
    ("int", "3.5"), ("int", True), ("float", "x"), ("bool", "maybe"), ("int", "none"),
    ("list[int]", "[1, 'a']"), ("str", True),
], ids=lambda x: repr(x))
def test_convert_value_refuses(typ, text):
    with pytest.raises(ParameterError, match=f"parameter 'p' expects {typ.removeprefix('list[').rstrip(']')}"):
        convert_value(Parameter("p", typ, None, help="the p"), text)


def test_bind_unknown_and_scoped(tmp_path):
    a, b = tmp_path / "a.ipynb", tmp_path / "b.ipynb"
    declared = {a: [Parameter("layer", "int", 0)], b: [Parameter("tol", "float", 0.0)]}
    bound = _bind([a, b], declared, [("layer", "2"), ("b.tol", "0.5")])
    assert bound == {a: {"layer": 2}, b: {"tol": 0.5}}
    with pytest.raises(ParameterError, match="unknown parameter 'lyer'") as e:
        _bind([a, b], declared, [("lyer", "2")])
    assert "use one of ['layer', 'tol']" in str(e.value)
    with pytest.raises(ParameterError, match="unknown parameter 'layer'"):
        _bind([a, b], declared, [("b.layer", "2")])
    with pytest.raises(ParameterError, match="names notebook 'c'"):
        _bind([a, b], declared, [("c.layer", "2")])


def test_params_file(tmp_path):
    f = tmp_path / "p.yaml"
    f.write_text("layer: 2\ntour:\n  tol: 0.5\n")
    assert load_params_file(f) == [("layer", 2), ("tour.tol", 0.5)]
    f.write_text("- 1\n")
    with pytest.raises(ParameterError, match="must hold a mapping"):
        load_params_file(f)


def _plotly_nb():
    import plotly.graph_objects as go

    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4])).to_plotly_json()
    c = new_code_cell("fig")
    c.outputs = [new_output("display_data", data={PLOTLY_MIMETYPE: fig, "text/plain": "Figure()"})]
    return new_notebook(cells=[c])


def test_export_html_is_offline_and_shows_plotly(tmp_path):
    page = export_html(_plotly_nb(), tmp_path / "r.html").read_text()
    assert page.count('<script src="plotly.min.js"></script>') == 1
    assert "Plotly.newPlot" in page and 'class="plotly-graph-div"' in page
    assert len(page) < 1_000_000  # no inline plotly.js
    for cdn in ("cdn.plot.ly", "require.js", "cdnjs", "mathjax@", "MathJax.js"):
        assert cdn not in page


def test_pdf_of_a_report_holds_its_text_and_drawn_figures(tmp_path, monkeypatch):
    # printed by headless Chromium from the offline page: the figure is drawn (its axis titles and
    # legend are text in the PDF), the markdown is there; without a Chromium, a typed error says how
    import plotly.graph_objects as go
    import pypdf

    from workbench.runner.report import copy_plotly_js, export_pdf, find_chromium

    if find_chromium() is None:
        pytest.skip("no chromium binary (apt-get install chromium, or set WORKBENCH_CHROMIUM)")
    fig = go.Figure(go.Scatter(x=[1, 2], y=[3, 4], name="candidate curve"))
    fig.update_layout(title="error per layer", xaxis_title="layer index", yaxis_title="relative L2 error",
                      showlegend=True)
    c = new_code_cell("fig")
    c.outputs = [new_output("display_data", data={PLOTLY_MIMETYPE: fig.to_plotly_json(), "text/plain": "Figure()"})]
    nb = new_notebook(cells=[new_markdown_cell("# Where do the runs part?"), c])
    copy_plotly_js(tmp_path)
    page = export_html(nb, tmp_path / "r.html")
    pdf = export_pdf(page)
    assert pdf == tmp_path / "r.pdf" and pdf.read_bytes()[:5] == b"%PDF-"
    text = " ".join(pg.extract_text() for pg in pypdf.PdfReader(str(pdf)).pages)
    for words in ("Where do the runs part?", "error per layer", "layer index", "relative L2 error",
                  "candidate curve"):
        assert words in text, (words, text[:500])
    assert [f.name for f in tmp_path.iterdir() if f.name.endswith(".tmp")] == []
    monkeypatch.setenv("WORKBENCH_CHROMIUM", str(tmp_path / "no-such-browser"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(NotebookError, match="no Chromium") as e:
        export_pdf(page, tmp_path / "again.pdf")
    assert "apt-get install chromium" in e.value.fix and not (tmp_path / "again.pdf").exists()


def test_report_opens_with_a_summary_and_folds_code(tmp_path):
    """The report a reviewer reads: the question (first markdown cell), then status, inputs (a
    capture parameter's arm and description from its manifest), findings, the gate table, and the
    code folded under "code" (open with show_code); user text in the summary is escaped."""
    from workbench.runner.report import capture_inputs, summary_html

    nb = _plotly_nb()
    nb.cells.insert(0, new_markdown_cell("# Which key diverges first?"))
    nb.cells.append(new_code_cell("y = 2"))
    ctl = Path(__file__).resolve().parents[1] / "captures" / "control"
    inputs = capture_inputs({"control": str(ctl), "layer": 3, "other": "not/a/capture"})
    assert [(i["parameter"], i["arm"]) for i in inputs] == [("control", "control")]
    assert inputs[0]["description"].startswith("reference run of the hybrid decoder")
    summary = summary_html(notebook="notebooks/x.ipynb", status="failed", ipynb="x.ipynb",
                           parameters={"control": str(ctl), "layer": 3}, inputs=inputs,
                           findings=[{"text": "layer 3 <qsa> diverges", "data": {}}],
                           gates=[{"name": "aa_noise", "kind": "regression", "passed": False, "value": 0.5,
                                   "op": "<=", "threshold": 0.1, "help": "A/A noise"}],
                           provenance={"commit": "abc123", "workbench": "0.1.0"})
    page = export_html(nb, tmp_path / "r.html", summary=summary).read_text()
    assert page.index("Which key diverges first?") < page.index('<section class="wb-summary">') < page.index("Plotly.newPlot")
    for text in ("layer 3 &lt;qsa&gt; diverges", "<td>aa_noise</td>", "FAILED", "0.5 &lt;= 0.1", "commit abc123",
                 "<h3>Inputs</h3>", "<h3>Findings</h3>", "<h3>Gates</h3>", 'href="x.ipynb"'):
        assert text in page, text
    assert page.count('<details class="wb-code">') == 2  # both code cells folded
    shown = export_html(nb, tmp_path / "s.html", summary=summary, show_code=True).read_text()
    assert '<details class="wb-code">' not in shown and '<section class="wb-summary">' in shown


def _write(tmp_path, nb, name="n.ipynb"):
    p = tmp_path / name
    nbformat.write(nb, p)
    return p


def test_cli_refuses_unknown_parameter(tmp_path, capsys):
    p = _write(tmp_path, _nb())
    rc = main(["run", str(p), "-p", "layr", "3", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "ParameterError: unknown parameter 'layr'" in err and "'layer'" in err
    assert not (tmp_path / "out").exists()


def test_cli_refuses_bad_value_and_missing_parameters_cell(tmp_path, capsys):
    p = _write(tmp_path, _nb())
    assert main(["run", str(p), "-p", "layer", "three"]) == 2
    assert "parameter 'layer' expects int, got 'three'" in capsys.readouterr().err
    q = _write(tmp_path, _nb(None), "bare.ipynb")
    assert main(["run", str(q)]) == 2
    err = capsys.readouterr().err
    assert "NotebookError" in err and "bare.ipynb" in err and "tagged 'parameters'" in err
    assert main(["run", str(tmp_path / "missing.ipynb")]) == 2
    assert "no such notebook" in capsys.readouterr().err


def test_run_from_outside_the_checkout_uses_the_notebooks_repository(tmp_path, monkeypatch):
    from workbench.runner import run_notebooks

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("WORKBENCH_ROOT", raising=False)
    nb = Path(__file__).resolve().parents[1] / "notebooks" / "tour.ipynb"
    res = run_notebooks([nb], out=tmp_path / "r", html_reports=False, log=lambda *a: None)
    assert res.ok, res.notebooks[0].describe()  # captures/control resolved in the notebooks' checkout
