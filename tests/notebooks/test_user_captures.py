"""The flagship notebook on captures the workbench never made: a tiny random Hugging Face Llama
recorded with workbench.record (no expectation metadata), with a planted change at a layer and a
step; relative paths given from the directory the user runs in."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

import workbench
from workbench.runner import run_notebooks

pytestmark = pytest.mark.slow  # the end-to-end tier: make test-all (CI), not make test

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "first_divergence.ipynb"
PLANTED = "rank=0 step=1 layer=2 op=mlp name=output"


@pytest.fixture(scope="module")
def user_runs(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("user")
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35]])
    opts = dict(include=["model.layers.*", "lm_head"], exclude=["*rotary_emb*"])

    def rec(m, name):
        with torch.no_grad(), workbench.record(m, d / name, arm=name, **opts):
            m.generate(ids, max_new_tokens=3, min_new_tokens=3, do_sample=False)

    rec(model, "control")
    rec(model, "control-repeat")
    cand = copy.deepcopy(model)
    calls = {"n": 0}

    def fault(module, args, out):  # layer 2's MLP is off by 1e-2 relative at decode step 1 only
        calls["n"] += 1
        return out * (1 + 1e-2) if calls["n"] == 2 else out

    handle = cand.model.layers[2].mlp.register_forward_hook(fault)
    rec(cand, "candidate")
    handle.remove()
    return d


def _run(d, out, **params):
    res = run_notebooks([NOTEBOOK], parameters={"control": "control", "candidate": "candidate",
                                                "aa": "control-repeat", **params},
                        out=out, html_reports=False, log=lambda *a: None)
    (r,) = res.notebooks
    return r


def test_user_capture_without_metadata_reports_the_finding_and_passes(user_runs, tmp_path, monkeypatch):
    monkeypatch.chdir(user_runs)  # relative paths are the user's, read from where they run
    r = _run(user_runs, tmp_path / "a")
    assert r.status == "passed", r.describe()
    texts = [f["text"] for f in r.findings]
    assert texts[0].startswith("first divergence: rank 0, step 1, layer 2, mlp/output"), texts
    assert any("tokens" in t for t in texts)  # argmax of lm_head/output: no sampler tensor here
    assert r.findings[0]["data"]["key"] == PLANTED
    gates = {g["name"]: g for g in r.gates}
    assert "first_divergence_key" not in gates  # no expectation given: reported, not gated
    assert gates["aa_noise_rel_l2"]["passed"] and gates["keys_compared"]["passed"]
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert saved["notebooks"][0]["findings"][0]["text"] == texts[0]
    assert "first divergence: rank 0, step 1" in (tmp_path / "a" / "index.html").read_text()


def test_expectation_gate_checks_the_whole_key(user_runs, tmp_path, monkeypatch):
    monkeypatch.chdir(user_runs)
    right = _run(user_runs, tmp_path / "right", expect_first=PLANTED)
    assert right.status == "passed", right.describe()
    wrong = _run(user_runs, tmp_path / "wrong", expect_first=PLANTED.replace("step=1", "step=0"))
    assert wrong.status == "failed" and wrong.error["gates"] == ["first_divergence_key"]
    strict = _run(user_runs, tmp_path / "strict", allow_divergence=False, first_not_before_layer=3)
    assert strict.status == "failed"
    assert sorted(strict.error["gates"]) == ["first_divergence_layer_min", "keys_diverged"]
