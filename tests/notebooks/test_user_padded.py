"""Regret against a golden model on a batched engine with a padding bug (user_padded.py): the
padded sequence, and only it, selects tokens the golden model rejects."""

from __future__ import annotations

import json

import numpy as np
import pytest

from workbench.analysis.regret import describe_regret, golden_logits_hf, golden_regret, golden_regret_captures, load_hf_model
from workbench.errors import KernelArgumentError

from .helpers import gates_by_name, run_one
from .user_padded import PADDED_SEQ, STEPS, write_padded_runs

pytestmark = pytest.mark.slow  # the end-to-end tier: make test-all (CI), not make test


@pytest.fixture(scope="module")
def padded(tmp_path_factory):
    d = tmp_path_factory.mktemp("padded")
    info = write_padded_runs(d)
    (d / "prompts.json").write_text(json.dumps(info["prompts"]))
    return d, info


def test_hand_derived_seed_case():
    # seq 3, pos 2: the golden model prefers token 0 by 0.25 nats over the selected token 1
    g = np.zeros((4, 3, 3))
    g[3, 2] = [0.25, 0.0, -5.0]
    sel = np.ones((4, 3), dtype=np.int64)
    sel[:, :2] = 0
    ds = golden_regret(sel, g, limit=0.20)
    assert (int(ds.worst_seq), int(ds.worst_pos)) == (3, 2) and float(ds.worst) == pytest.approx(0.25, abs=1e-15)
    assert int(ds.n_fail) == 1 and bool(ds.fails[3, 2])
    # the other pos-2 rows select 1 among three equal logits: regret exactly 0 (golden best is token 0 by index)
    assert np.all(ds.regret.values[:3] == 0.0)
    assert "1 over the 0.2-nat limit: seq 3 pos 2 (0.25)" in describe_regret(ds)
    sel[0, 0] = -1  # a finished sequence: left out
    assert int(golden_regret(sel, g).n_scored) == 11
    with pytest.raises(KernelArgumentError, match="outside the golden vocabulary"):
        golden_regret([[7]], [[[0.0, 1.0]]])


def test_only_the_padded_sequence_fails_against_the_golden_capture(padded):
    d, info = padded
    ds = golden_regret_captures(d / "candidate", d / "golden", limit=0.20)
    assert ds.sizes == {"seq": 4, "pos": STEPS}
    unpadded = np.delete(ds.regret.values, PADDED_SEQ, axis=0)
    assert np.nanmax(unpadded) < 1e-4  # batch-shape arithmetic only
    assert int(ds.n_fail) >= 1 and set(np.nonzero(ds.fails.values)[0].tolist()) == {PADDED_SEQ}
    assert int(ds.worst_seq) == PADDED_SEQ and float(ds.worst) > 0.20


def test_golden_model_run_here_agrees_with_the_golden_capture(padded):
    d, info = padded
    model, how = load_hf_model(d / "model")
    assert how == "weights"
    from_model = golden_regret(np.array(info["selected"]), golden_logits_hf(model, info["prompts"], info["selected"]))
    from_capture = golden_regret_captures(d / "candidate", d / "golden")
    np.testing.assert_allclose(from_model.regret.values, from_capture.regret.values, atol=1e-5)


def test_golden_regret_notebook_on_both_golden_sources(padded, tmp_path, monkeypatch):
    d, info = padded
    monkeypatch.chdir(d)
    cap = golden_regret_captures(d / "candidate", d / "golden")
    where = f"{int(cap.worst_seq)},{int(cap.worst_pos)}"
    r = run_one(tmp_path / "a", "golden_regret", candidate="candidate", golden="golden", expect_worst=where)
    assert r.status == "failed" and r.error["gates"] == ["golden_regret_max"]  # the padded row's regret bites
    assert gates_by_name(r)["worst_position"]["passed"]
    assert f"at seq {PADDED_SEQ}, pos" in r.findings[0]["text"] and "over the 0.2-nat limit" in r.findings[0]["text"]
    m = run_one(tmp_path / "b", "golden_regret", candidate="candidate", golden="", golden_model="model",
                prompts="prompts.json", limit=1.0, expect_worst=where)
    assert m.status == "passed", m.describe()
    assert "golden model model (LlamaForCausalLM, weights)" in m.findings[0]["text"]
