"""workbench.notebook: gates, their display record, assert_gates, repo-relative paths."""

from __future__ import annotations

import math

import pytest

import workbench.notebook as wb
from workbench.errors import GateError, WorkbenchError


@pytest.fixture(autouse=True)
def _fresh():
    wb.reset_gates()
    yield
    wb.reset_gates()


@pytest.mark.parametrize("value,threshold,op,passed", [
    (1e-7, 1e-5, "<=", True), (1e-5, 1e-5, "<=", True), (2e-5, 1e-5, "<=", False),
    (1e-5, 1e-5, "<", False), (3, 3, "==", True), (2, 3, "==", False), (5, 1, ">=", True),
    (0, 1, ">", False), (1, 2, "!=", True), (math.nan, 1.0, "<=", False), (math.nan, 1.0, ">=", False),
], ids=lambda x: str(x))
def test_gate_verdict(value, threshold, op, passed):
    wb.gate("g", value, threshold, op=op, display=False)
    (g,) = wb.gates()
    assert g.passed is passed and g.op == op


def test_gate_display_carries_machine_record(monkeypatch):
    shown = []
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append((obj, raw)))
    wb.gate("aa_noise", 2.0, 1.0, help="why")
    (obj, raw), = shown
    assert raw
    rec = obj[wb.GATE_MIMETYPE]
    assert rec == {"name": "aa_noise", "value": 2.0, "threshold": 1.0, "op": "<=", "passed": False, "help": "why"}
    assert "FAIL" in obj["text/plain"] and "aa_noise" in obj["text/html"]


def test_gate_values_become_json(monkeypatch):
    import numpy as np
    import torch

    wb.gate("np", np.float32(0.5), np.int64(1), display=False)
    wb.gate("t", torch.tensor(2.0), 1.0, op=">", display=False)
    wb.gate("nan", float("nan"), 1.0, display=False)
    d = {g.name: g.to_dict() for g in wb.gates()}
    assert d["np"]["value"] == 0.5 and type(d["np"]["threshold"]) is int
    assert d["t"]["value"] == 2.0 and d["t"]["passed"]
    assert d["nan"]["value"] == "nan" and not d["nan"]["passed"]


def test_gate_same_name_replaces():
    wb.gate("g", 5, 1, display=False)
    wb.gate("g", 0, 1, display=False)
    assert [g.passed for g in wb.gates()] == [True]


def test_gate_errors():
    with pytest.raises(WorkbenchError, match="unknown op '=~'"):
        wb.gate("g", 1, 1, op="=~")
    with pytest.raises(WorkbenchError, match="non-empty string"):
        wb.gate("", 1, 1)
    with pytest.raises(WorkbenchError, match="cannot compare"):
        wb.gate("g", "a", 1, display=False)


def test_assert_gates_names_failures(capsys):
    wb.gate("ok_one", 1, 2, display=False)
    wb.assert_gates()
    assert "all 1 gate(s) passed: ok_one" in capsys.readouterr().out
    wb.gate("bad_one", 3, 2, display=False)
    wb.gate("bad_two", 1, 2, op=">", display=False)
    with pytest.raises(GateError) as e:
        wb.assert_gates()
    msg = str(e.value)
    assert "2 of 3 gate(s) failed: bad_one, bad_two" in msg and "3 <= 2 is false" in msg
    assert isinstance(e.value, AssertionError)


def test_assert_gates_requires_a_gate():
    with pytest.raises(GateError, match="only 0 gate"):
        wb.assert_gates()
    wb.assert_gates(require=0)


def test_setup_resets_gates_and_renderer():
    import plotly.io as pio

    wb.gate("g", 1, 2, display=False)
    wb.setup()
    assert wb.gates() == [] and pio.renderers.default == "plotly_mimetype"


def test_resolve_and_repo_root(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    (repo / "captures").mkdir()
    monkeypatch.delenv(wb.ROOT_ENV, raising=False)
    monkeypatch.chdir(repo / "notebooks")
    assert wb.repo_root() == repo
    assert wb.resolve("captures/control") == repo / "captures" / "control"
    assert wb.resolve("/abs/x") == wb.Path("/abs/x")
    monkeypatch.setenv(wb.ROOT_ENV, str(tmp_path))
    assert wb.resolve("c") == tmp_path / "c"
