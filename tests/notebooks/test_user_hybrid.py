"""gdn_state, replay, relocation, tour and paired_stats on data the workbench never made: a run
written with another engine's op names and no run metadata (tests/notebooks/user_hybrid.py: the
planted fault is a bf16 GDN state at layer 1), and per-prompt outcomes in a CSV file. Relative
paths are given from the directory the user runs in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workbench.analysis.stats import tango_paired_ci

from .helpers import found, gates_by_name, run_one, skipped
from .user_hybrid import BF16_LAYER, PREFILL, write_user_hybrid

pytestmark = pytest.mark.slow  # the end-to-end tier: make test-all (CI), not make test


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("engine")
    write_user_hybrid(d)
    return d


def test_gdn_state_finds_the_drifting_layer(engine_run, tmp_path, monkeypatch):
    monkeypatch.chdir(engine_run)
    arms = dict(control="control", candidate="candidate", aa="control-repeat")
    r = run_one(tmp_path / "a", "gdn_state", **arms)
    assert r.status == "passed", r.describe()
    drift, fp64, cont = (f["text"] for f in r.findings)
    assert drift.startswith("captured linear_attn/state, candidate vs control") and f"(layer {BF16_LAYER})" in drift, drift
    assert f"recorded whole at step 0 ({PREFILL} positions" in fp64 and "state_dtype=bf16 state" in fp64, fp64
    assert f"chunked {PREFILL // 2}+{PREFILL // 2} vs {PREFILL}" in cont, cont
    assert set(gates_by_name(r)) == {"state_keys_compared", "continuation_rel_l2", "handoff_rel_l2"}  # nothing expected
    # the regression gate on the A/A noise bites; an expectation of a flat state fails
    strict = run_one(tmp_path / "b", "gdn_state", **arms, max_drift_over_aa=10.0, expect="drift=flat")
    assert strict.status == "failed" and sorted(strict.error["gates"]) == ["drift_over_aa", "drift_within_aa"]


def test_gdn_state_from_decode_steps_only(engine_run, tmp_path, monkeypatch):
    # the state of layer 0 is identical in both arms: the drift is nil there; views 2-4 still run
    monkeypatch.chdir(engine_run)
    r = run_one(tmp_path / "a", "gdn_state", control="control", candidate="control-repeat", aa="", layer=0, tokens=8)
    assert r.status == "passed", r.describe()
    assert "(8 positions, zero initial state)" in r.findings[1]["text"]


def test_replay_discovers_the_state_policy(engine_run, tmp_path, monkeypatch):
    monkeypatch.chdir(engine_run)
    base = dict(capture="candidate", control="control", capture_op="linear_attn", backends=["torch"])
    r = run_one(tmp_path / "a", "replay", **base, layer=BF16_LAYER)
    assert r.status == "passed", r.describe()
    assert r.findings[0]["data"]["reproduced"] == "state_dtype=bf16", r.findings[0]
    assert [f["data"]["blamed"] for f in r.findings if "blamed" in f["data"]] == ["state_dtype"]
    moved = next(f for f in r.findings if "closer_cases" in f["data"])
    assert moved["text"].startswith("state_dtype=bf16 moves ") and 0 < moved["data"]["closer_cases"] <= moved["data"]["cases"]
    assert set(gates_by_name(r)) == {"reproduced_rel_l2"}
    right = run_one(tmp_path / "b", "replay", **base, layer=BF16_LAYER, expect="reproduced=state_dtype=bf16 blamed=state_dtype")
    assert right.status == "passed", right.describe()
    wrong = run_one(tmp_path / "c", "replay", **base, layer=0, expect="reproduced=state_dtype=bf16")
    assert wrong.status == "failed" and wrong.error["gates"] == ["reproduced_by"]
    assert wrong.findings[0]["data"]["reproduced"] == "base"  # layer 0 kept its fp32 state


def test_relocation_on_captured_attention_inputs(engine_run, tmp_path, monkeypatch):
    monkeypatch.chdir(engine_run)
    r = run_one(tmp_path / "a", "relocation", control="control")
    assert r.status == "passed", r.describe()
    text = found(r)[0]["text"]
    assert text.startswith("kernel level, torch on cpu (captured sparse_attn q, k, v, indices") and \
        "invariant page orders logical;" in text
    # every QSA backend that runs here is checked (ext's CPU build), the others said skipped with the reason
    ran = ["torch", "ext"] if not torch.cuda.is_available() else ["torch", "ext", "numba"]
    assert [f["data"]["backend"] for f in found(r) if f["text"].startswith("kernel level")] == ran
    if not torch.cuda.is_available():
        assert "numba.cuda" in skipped(r)["qsa backend numba on cpu"]
    assert set(gates_by_name(r)) == {"logical_kernel_invariant", "physical_kernel_changes"} | {
        f"logical_kernel_invariant_{b}" for b in ran[1:]}  # no model to re-run


def test_tour_shows_the_first_divergence(engine_run, tmp_path, monkeypatch):
    monkeypatch.chdir(engine_run)
    r = run_one(tmp_path / "a", "tour", capture="control", other="candidate")
    assert r.status == "passed", r.describe()
    assert f"rank=0 step=0 layer={BF16_LAYER} op=linear_attn name=core (the first divergence)" in r.findings[0]["text"]
    named = run_one(tmp_path / "b", "tour", capture="control", other="candidate", tensor="rank=0 step=3 layer=0 op=linear_attn name=state")
    assert "name=state (as given)" in named.findings[0]["text"] and "rel. L2 0.000e+00" in named.findings[0]["text"]


def test_paired_stats_reads_outcomes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = ["prompt,ctl,cand"] + [f"p{i},{c},{d}" for i, (c, d) in enumerate(
        [("pass", "pass")] * 40 + [("pass", "fail")] * 12 + [("fail", "pass")] * 1 + [("fail", "fail")] * 11)]
    Path("quality.csv").write_text("\n".join(rows) + "\n")
    lo, hi = tango_paired_ci(40, 12, 1, 11)  # a write-up that reported Tango's interval, without saying so
    r = run_one(tmp_path / "a", "paired_stats", outcomes="quality.csv", control_column="ctl", candidate_column="cand",
                reported=f"52/64 vs 41/64: [{100 * lo:.4f}, {100 * hi:.4f}] pp", interval="tango")
    assert r.findings[0]["text"].startswith("quality (outcomes of 64 prompts from quality.csv): control 52/64, candidate 41/64")
    texts = [f["text"] for f in r.findings]
    assert any(t.startswith("paired intervals on -17.1875 pp (95%): newcombe [") for t in texts), texts
    assert any("reproduced by tango at 12 control-only vs 1 candidate-only pairs" in t for t in texts), texts
    assert r.status == "failed" and r.error["gates"] == ["no_significant_loss"]  # 12 vs 1 is a real loss
    bad = run_one(tmp_path / "b", "paired_stats", outcomes="quality.csv")  # default column names absent
    assert bad.status == "failed" and "has no column 'control'" in str(bad.error)
