"""workbench.notebook: gates, their display record, assert_gates, repo-relative paths."""

from __future__ import annotations

import math

import pytest

from workbench import notebook as nb
from workbench.errors import GateError, WorkbenchError


@pytest.fixture(autouse=True)
def _fresh():
    nb.reset_gates()
    yield
    nb.reset_gates()


@pytest.mark.parametrize("value,threshold,op,passed", [
    (1e-7, 1e-5, "<=", True), (1e-5, 1e-5, "<=", True), (2e-5, 1e-5, "<=", False),
    (1e-5, 1e-5, "<", False), (3, 3, "==", True), (2, 3, "==", False), (5, 1, ">=", True),
    (0, 1, ">", False), (1, 2, "!=", True), (math.nan, 1.0, "<=", False), (math.nan, 1.0, ">=", False),
], ids=lambda x: str(x))
def test_gate_verdict(value, threshold, op, passed):
    nb.gate("g", value, threshold, op=op, display=False)
    (g,) = nb.gates()
    assert g.passed is passed and g.op == op


def test_gate_display_carries_machine_record(monkeypatch):
    shown = []
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append((obj, raw)))
    nb.gate("aa_noise", 2.0, 1.0, help="why")
    (obj, raw), = shown
    assert raw
    rec = obj[nb.GATE_MIMETYPE]
    assert rec == {"name": "aa_noise", "value": 2.0, "threshold": 1.0, "op": "<=", "passed": False, "help": "why",
                   "kind": "regression"}
    assert "FAIL" in obj["text/plain"] and "aa_noise" in obj["text/html"]


def test_gate_values_become_json(monkeypatch):
    import numpy as np
    import torch

    nb.gate("np", np.float32(0.5), np.int64(1), display=False)
    nb.gate("t", torch.tensor(2.0), 1.0, op=">", display=False)
    nb.gate("nan", float("nan"), 1.0, display=False)
    d = {g.name: g.to_dict() for g in nb.gates()}
    assert d["np"]["value"] == 0.5 and type(d["np"]["threshold"]) is int
    assert d["t"]["value"] == 2.0 and d["t"]["passed"]
    assert d["nan"]["value"] == "nan" and not d["nan"]["passed"]


def test_gate_same_name_replaces():
    nb.gate("g", 5, 1, display=False)
    nb.gate("g", 0, 1, display=False)
    assert [g.passed for g in nb.gates()] == [True]


def test_gate_errors():
    with pytest.raises(WorkbenchError, match="unknown op '=~'"):
        nb.gate("g", 1, 1, op="=~")
    with pytest.raises(WorkbenchError, match="non-empty string"):
        nb.gate("", 1, 1)
    with pytest.raises(WorkbenchError, match="cannot compare"):
        nb.gate("g", "a", 1, display=False)


def test_assert_gates_names_failures(capsys):
    nb.gate("ok_one", 1, 2, display=False)
    nb.assert_gates()
    assert "all 1 gate(s) passed: ok_one" in capsys.readouterr().out
    nb.gate("bad_one", 3, 2, display=False)
    nb.gate("bad_two", 1, 2, op=">", display=False)
    with pytest.raises(GateError) as e:
        nb.assert_gates()
    msg = str(e.value)
    assert "2 of 3 gate(s) failed: bad_one, bad_two" in msg and "3 <= 2 is false" in msg
    assert isinstance(e.value, AssertionError)


def test_assert_gates_requires_a_gate():
    with pytest.raises(GateError, match="only 0 gate"):
        nb.assert_gates()
    nb.assert_gates(require=0)


def test_setup_resets_gates_and_renderer():
    import plotly.io as pio

    nb.gate("g", 1, 2, display=False)
    nb.setup()
    assert nb.gates() == [] and pio.renderers.default == "plotly_mimetype"


def test_resolve_and_repo_root(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "captures").mkdir()
    monkeypatch.delenv(nb.ROOT_ENV, raising=False)
    (repo / "captures" / "control").mkdir()
    monkeypatch.delenv(nb.CWD_ENV, raising=False)
    monkeypatch.chdir(repo / "notebooks")
    assert nb.repo_root() == repo
    # a bundled default, absent where the user runs: found in the repository
    assert nb.resolve("captures/control") == repo / "captures" / "control"
    assert nb.resolve("/abs/x") == nb.Path("/abs/x")
    # the user's own relative paths are read from where they run (workbench run passes it)
    user = tmp_path / "work"
    (user / "runs" / "a").mkdir(parents=True)
    (user / "captures" / "control").mkdir(parents=True)
    monkeypatch.setenv(nb.CWD_ENV, str(user))
    assert nb.resolve("runs/a") == user / "runs" / "a"
    assert nb.resolve("captures/control") == user / "captures" / "control"  # theirs wins over the bundled one
    assert nb.resolve("runs/typo") == user / "runs" / "typo"  # a missing path is named where they typed it
    monkeypatch.delenv(nb.CWD_ENV)
    monkeypatch.setenv(nb.ROOT_ENV, str(tmp_path))
    assert nb.resolve("work") == tmp_path / "work"  # not in the cwd: the root named by $WORKBENCH_ROOT


def test_offline_explorer_holds_every_choice_behind_plotly_dropdown():
    """explore(interactive=False): one figure with each combination's traces, plotly's dropdown
    showing one set at a time with that figure's own titles; sliders sampled, too many thinned."""
    import plotly.graph_objects as go

    from workbench.notebook import offline_explorer

    def fig(metric, op):
        return go.Figure([go.Scatter(y=[1, 2], name=f"{op} a"), go.Scatter(y=[3, 4], name=f"{op} b")],
                         layout=dict(title=f"{metric} of {op}", yaxis_title=metric, yaxis_type="log" if metric == "ulp" else None))

    f = offline_explorer(fig, metric=["rel_l2", "ulp"], op=["gdn", "qsa", "mlp"])
    assert len(f.data) == 12 and [t.visible for t in f.data[:4]] == [True, True, False, False]
    (menu,) = f.layout.updatemenus
    labels = [b.label for b in menu.buttons]
    assert labels[0] == "metric=rel_l2, op=gdn" and len(labels) == 6
    ulp_qsa = menu.buttons[labels.index("metric=ulp, op=qsa")]
    vis, patch = ulp_qsa.args
    assert [i for i, v in enumerate(vis["visible"]) if v] == [8, 9]
    assert patch["title.text"] == "ulp of qsa" and patch["yaxis.title.text"] == "ulp" and patch["yaxis.type"] == "log"
    big = offline_explorer(lambda a, b: go.Figure(go.Scatter(y=[a, b])), a=(0, 19, 1), b=(0, 19, 1), max_offline=48)
    n = len(big.layout.updatemenus[0].buttons)
    assert n <= 48 and big.layout.meta["of"] == 400
    assert "0, b=0" in big.layout.updatemenus[0].buttons[0].label and big.layout.updatemenus[0].buttons[-1].label == "a=19, b=19"
    assert f"({n} of 400 combinations)" in big.layout.title.text
