"""The capture-level analyses find their answer from the tensors, under any names, and say why
they cannot: logit_ties, sampling_flips_captures, splitk_explain, the lm_head tensor detection
and the weight loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from workbench import notebook as nb
from workbench.analysis import logit_ties, sampling_flips_captures, splitk_explain
from workbench.analysis.tokens import find_hidden, find_logits, load_weight
from workbench.capture import CaptureWriter, open_capture
from workbench.errors import AnalysisError, KernelArgumentError, WorkbenchError

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
V, D = 64, 8
A, B = 11, 40  # the planted pair: FP64 logits 9.005 (A) and 9.025 (B) both round to bf16 9.0 (ULP 1/16)


def _hidden(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(D, generator=g, dtype=torch.float64)


def _weight():
    g = torch.Generator().manual_seed(7)
    W = torch.randn(V, D, generator=g, dtype=torch.float64) * 0.05
    h = _hidden(2)
    for tok, value in ((A, 9.005), (B, 9.025)):  # exact dot products with step 2's hidden state
        W[tok] = h * (value / float(h @ h))
    return W


def _arm(path, arm, logits_dtype, *, op="model.lm_head", name="out", tok="next_token_ids", weight=False,
         steps=4, fork=False):
    """A capture named like no workbench capture: hidden ``op/in``, logits ``op/name`` in
    ``logits_dtype``, sampled tokens ``tok/value``; ``fork`` changes the hidden state after step 2."""
    W = _weight()
    w = CaptureWriter(path, arm=arm, overwrite=True)
    for s in range(steps):
        h = _hidden(s) + (0.5 if fork and s > 2 else 0.0)
        logits = (h @ W.T).to(getattr(torch, logits_dtype))
        w.add(h.float()[None], step=s, op=op, name="in")
        w.add(logits[None], step=s, op=op, name=name)
        w.add(torch.tensor([int(torch.argmax(logits.float()))]), step=s, op=tok, name="value")
    if weight:
        w.add(W.float(), step=0, op=op, name="weight")
    w.close()
    return path


@pytest.fixture
def arms(tmp_path):
    return (_arm(tmp_path / "c", "control", "bfloat16", weight=True, fork=True),
            _arm(tmp_path / "d", "candidate", "float32", weight=True))


def test_logit_ties_finds_the_tie_the_step_and_the_fp64_truth(arms):
    ds = logit_ties(*arms)
    a = ds.attrs
    assert a["focus_step"] == 2 and a["first_differing_step"] == 2 and a["focus_reason"].startswith("the first step")
    assert a["tied_tokens"] == [A, B] and a["logits"] == {"control": "model.lm_head/out", "candidate": "model.lm_head/out"}
    assert a["truth_source"].startswith("FP64 product of model.lm_head/in")
    assert int(ds.chosen.sel(step=2, arm="control")) == A and int(ds.truth_token.sel(step=2, arm="control")) == B
    assert int(ds.chosen.sel(step=2, arm="candidate")) == B
    h, W = _hidden(2), _weight()
    lp = torch.log_softmax(h @ W.T, -1)
    assert float(ds.regret.sel(step=2, arm="control")) == pytest.approx(float(lp[B] - lp[A]), abs=1e-6)
    assert a["n_ties_by_index"] == {"control": 1, "candidate": 0}
    assert "picks 11 from a 2-way tie of tokens 11, 40 at 9 " in a["sentence"]


def test_logit_ties_without_weight_uses_the_precise_arm_only_while_prefixes_agree(tmp_path):
    c = _arm(tmp_path / "c", "control", "bfloat16", fork=True)
    d = _arm(tmp_path / "d", "candidate", "float32")
    ds = logit_ties(c, d)
    assert "candidate's fp32 logits widened" in ds.attrs["truth_source"]
    assert ds.truth_token.sel(step=3).values.tolist() == [-1, -1]  # after the fork: no truth claimed
    assert bool(ds.regret.sel(step=3).isnull().all())
    assert int(ds.truth_token.sel(step=2, arm="control")) == B


def test_logit_ties_without_divergence_explains_a_tie_decided_by_index(tmp_path):
    # both arms bf16: the same tie, same tokens; the tie rule decided step 2 against FP64
    c = _arm(tmp_path / "c", "control", "bfloat16", weight=True)
    d = _arm(tmp_path / "d", "candidate", "bfloat16", weight=True)
    ds = logit_ties(c, d)
    assert ds.attrs["first_differing_step"] == -1 and ds.attrs["focus_step"] == 2
    assert "decides against the truth" in ds.attrs["focus_reason"]
    assert bool(ds.tie_by_index.sel(step=2).all()) and ds.attrs["n_ties_by_index"]["control"] >= 1


def test_names_are_detected_or_named_and_ambiguity_lists_candidates(tmp_path):
    c = _arm(tmp_path / "c", "control", "float32", weight=True)
    assert find_logits(open_capture(c)) == ("model.lm_head", "out")
    assert find_hidden(open_capture(c), ("model.lm_head", "out")) == ("model.lm_head", "in")  # its only other tensor
    w = CaptureWriter(tmp_path / "amb", arm="x")
    for s in range(2):
        w.add(torch.zeros(1, V), step=s, op="head_a", name="output")
        w.add(torch.zeros(1, V), step=s, op="head_b", name="output")
    w.close()
    with pytest.raises(AnalysisError, match=r"several logits-like tensors.*head_a/output.*head_b/output"):
        logit_ties(tmp_path / "amb", tmp_path / "amb")
    ds = logit_ties(tmp_path / "amb", tmp_path / "amb", logits="head_b/output")
    assert ds.attrs["logits"]["control"] == "head_b/output"


def test_load_weight_from_capture_or_safetensors_and_its_errors(tmp_path):
    c = open_capture(_arm(tmp_path / "c", "control", "float32", weight=True))
    w, where = load_weight(c, "", vocab=V, hidden=D)
    assert where == "model.lm_head/weight" and w.shape == (V, D)
    save_file({"lm_head.weight": _weight().float(), "other": torch.zeros(3)}, str(tmp_path / "m.safetensors"))
    w2, where2 = load_weight(c, f"{tmp_path}/m.safetensors:lm_head.weight", vocab=V, hidden=D)
    assert torch.equal(w2, w) and where2 == "m.safetensors:lm_head.weight"
    with pytest.raises(AnalysisError, match="has no tensor 'nope'"):
        load_weight(c, f"{tmp_path}/m.safetensors:nope", vocab=V, hidden=D)
    with pytest.raises(AnalysisError, match=r"not an lm_head weight \[V=64, D=8\]"):
        load_weight(c, f"{tmp_path}/m.safetensors:other", vocab=V, hidden=D)
    with pytest.raises(AnalysisError, match="does not exist"):
        load_weight(c, f"{tmp_path}/missing.safetensors:w", vocab=V, hidden=D)
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    with pytest.raises(AnalysisError, match="not a readable safetensors file"):
        load_weight(c, f"{tmp_path}/bad.safetensors:w", vocab=V, hidden=D)
    with pytest.raises(AnalysisError, match="has no tensor x/y"):
        load_weight(c, "x/y", vocab=V, hidden=D)
    assert load_weight(c, "", vocab=V + 1, hidden=D)[0] is None


def test_sampling_flips_captures_picks_the_largest_total_variation_before_the_fork(arms):
    ds = sampling_flips_captures(*arms)
    assert ds.step.values.tolist() == [0, 1, 2]  # step 3 follows different tokens
    assert ds.attrs["step"] == int(ds.step.values[int(ds.tv_by_step.values.argmax())])
    assert (ds.width_by_step >= ds.tv_by_step - 1e-12).all()
    assert ds.attrs["sentence"].startswith(f"step {ds.attrs['step']}: a shared draw u")
    with pytest.raises(KernelArgumentError, match="prefixes agree only at steps 0..2"):
        sampling_flips_captures(*arms, step=3)


def test_splitk_explain_reads_weight_and_says_rounding_alone_flips(arms, tmp_path):
    c, d = arms
    hidden_named = splitk_explain(c, d, splits=range(1, 5), orders=("sequential",))
    a = hidden_named.attrs
    assert a["step"] == 2 and a["fp64_argmax"] == B and a["tokens"] == {"control": A, "candidate": B}
    assert "rounding the logits to bf16 alone changes the token" in a["findings"][0]
    assert bool(hidden_named.reproduces_control.all())  # every configuration rounds to the tie
    lone = CaptureWriter(tmp_path / "lone", arm="x")
    for s in range(2):
        lone.add(torch.zeros(1, V), step=s, op="head", name="output")
    lone.close()
    with pytest.raises(KernelArgumentError, match="holds no lm_head input"):
        splitk_explain(tmp_path / "lone", splits=range(1, 3))


def test_expectations_parser():
    fields = {"step": int, "tied": list, "regret": float, "op": str}
    assert nb.expectations("step=1 tied=3,4 regret=0.5 op=x", fields) == {"step": 1, "tied": [3, 4], "regret": 0.5,
                                                                         "op": "x"}
    assert nb.expectations("", fields) == {}
    assert nb.expectations("metadata", fields, metadata={"step": 0, "tied": None, "zzz": 1}) == {"step": 0}
    with pytest.raises(WorkbenchError, match="'pick=3' is not field=value"):
        nb.expectations("pick=3", fields)
    with pytest.raises(WorkbenchError, match="step='x' is not a int"):
        nb.expectations("step=x", fields)


def test_bundled_tie_is_found_from_tensors_not_metadata():
    ds = logit_ties(CAPTURES / "tie-control", CAPTURES / "tie-candidate")
    planted = open_capture(CAPTURES / "tie-control").run["tie"]
    assert ds.attrs["tied_tokens"] == sorted(int(t) for t in planted["fp64_logits"])
    assert float(ds.regret.sel(step=0, arm="control")) == pytest.approx(planted["nats_lost"], abs=1e-9)


def test_fed_token_ids_are_not_taken_for_the_sampled_tokens(tmp_path):
    """``model.embed_tokens/input`` (the prompt ids a recorder sees) is what the model was fed:
    equal in both arms by construction, so tokens come from the logits' argmax; a sampler's
    output is still found."""
    from workbench.analysis.tokens import find_tokens, token_agreement

    def arm(path, flip):
        w = CaptureWriter(path, arm=path.name, overwrite=True)
        for s in range(2):
            w.add(torch.tensor([[3, 5, 7]]), step=s, op="model.embed_tokens", name="input")
            logits = torch.zeros(1, V)
            logits[0, 9 if flip and s == 1 else 4] = 1.0
            w.add(logits, step=s, op="lm_head", name="output")
        w.close()
        return open_capture(path)

    c, d = arm(tmp_path / "c", False), arm(tmp_path / "d", True)
    assert find_tokens(c) is None
    tok = token_agreement(c, d)
    assert tok.attrs["n_agree"] == 1 and tok.attrs["first_differing_step"] == 1, tok.attrs["sentence"]
    assert "lm_head/output" in tok.attrs["sentence"]
    assert find_tokens(_arm(tmp_path / "e", "control", "float32")) == ("next_token_ids", "value")
