"""The bundled captures: intact, regenerable, and each holding exactly its planted finding."""

from pathlib import Path

import pytest
import torch

from workbench.analysis.compare import Rule, compare_captures
from workbench.capture import open_capture
from workbench.kernels import gemm, sampling
from workbench.models.hybrid import ArmConfig
from workbench.models.sample import CAPTURES, PAIRS, SPLITK, TIE, tie_model, write_samples
from workbench.numerics.metrics import compare

BUNDLED = Path(__file__).resolve().parents[2] / "captures"
KEY = ("rank", "step", "layer", "op", "name")


def _cap(name):
    return open_capture(BUNDLED / name)


def _key(row):
    return {f: (int(row[f]) if f in ("rank", "step", "layer") else row[f]) for f in KEY}


@pytest.mark.parametrize("name", list(CAPTURES))
def test_bundled_capture_is_intact_and_says_what_it_is(name):
    cap = _cap(name)
    assert cap.verify().ok and cap.arm == name
    assert cap.run["description"] and cap.run["tokens"]
    if CAPTURES[name].expect is not None:
        assert cap.run["expect"]["first_divergence"] == CAPTURES[name].expect["first_divergence"]
        assert cap.run["expect"]["how"].startswith("workbench compare")


@pytest.mark.parametrize("control,candidate,aa", PAIRS, ids=[p[1] for p in PAIRS])
def test_compare_finds_exactly_the_planted_first_divergence(control, candidate, aa):
    want = _cap(candidate).run["expect"]["first_divergence"]
    # step k's tensors all precede step k + 1's in causal order, so comparing only the planted
    # step finds the same first divergence; the main demo pair is compared whole
    only = {} if want is None or candidate == "candidate" else {"step": want["step"]}
    r = compare_captures(BUNDLED / control, BUNDLED / candidate, aa=BUNDLED / aa if aa else None, **only)
    fd = r.first_divergence()
    assert (None if fd is None else _key(fd)) == want, r.describe_first()


def test_aa_repeat_is_real_noise_under_its_own_threshold():
    r = compare_captures(BUNDLED / "control", BUNDLED / "control-repeat")
    assert (r.table["n_diff"] > 0).mean() > 0.5 and r.first_divergence() is None
    assert _cap("control").run["tokens"] == _cap("control-repeat").run["tokens"]


def test_bf16_state_drift_grows_over_decode_steps():
    ctl, cand = _cap("control"), _cap("candidate-bf16-state")
    err = [compare(ctl.get(rank=0, step=s, layer=0, op="gdn", name="state"),
                   cand.get(rank=0, step=s, layer=0, op="gdn", name="state")).rel_l2 for s in range(65)]
    assert len(err) == 65 and min(err) > 0
    # about 3x from the prefill to step 64 (the state forgets slowly, rounding errors pile up)
    assert err[64] > 2 * err[0] and sum(err[-16:]) > 1.2 * sum(err[1:17]), err


def test_tie_after_bf16_rounding_goes_to_the_lower_index():
    ctl, cand = _cap("tie-control"), _cap("tie-candidate")
    lo, hi = TIE["low_id"], TIE["high_id"]
    fp64 = ctl.run["tie"]["fp64_logits"]
    assert abs(fp64[str(lo)] - TIE["low_logit"]) < 1e-5 and abs(fp64[str(hi)] - TIE["high_logit"]) < 1e-5
    assert torch.tensor(fp64[str(lo)]).bfloat16() == torch.tensor(fp64[str(hi)]).bfloat16() == 11.125
    logits = ctl.get(step=0, op="lm_head", name="logits")
    assert logits.dtype == torch.bfloat16 and logits[0, lo] == logits[0, hi] == logits.max()
    assert ctl.run["tokens"][0] == lo and cand.run["tokens"][0] == hi
    # replay, independent of the recorded metadata: the captured hidden state through the model's
    # own lm_head weight (rebuilt by tie_model) in FP64 gives the planted logits, both bf16 11.125,
    # with 692 the FP64 winner, 0.0234 nats above the token greedy took
    model, _ = tie_model(ArmConfig(name="tie-control"))
    h = ctl.get(step=0, op="lm_head", name="input").double().reshape(-1)
    fp64 = model.weights["lm_head"].double() @ h
    assert abs(float(fp64[lo]) - 11.117631) < 2e-5 and abs(float(fp64[hi]) - 11.140996) < 2e-5
    assert float(fp64[lo].float().bfloat16()) == float(fp64[hi].float().bfloat16()) == 11.125
    assert int(fp64.argmax()) == hi and float(fp64[hi] - fp64[lo]) == pytest.approx(0.023365, abs=2e-5)


def test_splitk_flip_is_real_and_replays_from_the_capture():
    ctl, flip = _cap("splitk-control"), _cap("splitk-flip")
    lo, hi = SPLITK["lo_id"], SPLITK["hi_id"]
    assert ctl.run["tokens"][0] == hi and flip.run["tokens"][0] == lo
    h = flip.get(step=0, op="lm_head", name="input")
    w = flip.get(step=0, op="lm_head", name="weight")
    pick = {s: int(sampling.greedy(gemm.splitk_matmul(h, w, splits=s, partial_dtype="bf16").bfloat16()))
            for s in (9, 16)}
    assert pick == {9: lo, 16: hi}
    assert int(sampling.greedy(gemm.splitk_matmul(h, w, splits=9, partial_dtype="fp32").bfloat16())) == hi
    assert 9 in flip.run["splitk"]["flipping_splits_bf16_partials"]
    assert 16 not in flip.run["splitk"]["flipping_splits_bf16_partials"]


def test_tp4_capture_carries_four_ranks():
    assert set(_cap("tp4-control").index["rank"]) == {0, 1, 2, 3}
    assert set(_cap("control").index["rank"]) == {0, 1}


def test_hf_pair_differs_only_by_fp32_noise_from_the_gdn_kernel():
    a, b = BUNDLED / "hf-qwen3next-control", BUNDLED / "hf-qwen3next-candidate"
    exact = compare_captures(a, b, rules=[Rule("*", threshold=0.0)]).first_divergence()
    assert _key(exact) == _cap("hf-qwen3next-candidate").run["expect"]["first_difference"]
    assert _cap("hf-qwen3next-control").run["tokens"] == _cap("hf-qwen3next-candidate").run["tokens"]


@pytest.mark.slow  # regenerates every bundled capture: make test-all (CI)
def test_regeneration_reproduces_the_bundled_captures(tmp_path):
    """Bitwise, tensor by tensor, on any x86-64 CPU: write_samples records in a child process
    with the portable arithmetic of workbench.numerics.portable (the committed captures were
    written that way; their run["arithmetic"] says so)."""
    paths = write_samples(tmp_path)
    assert sorted(p.name for p in paths) == sorted(CAPTURES)
    cols = ["rank", "step", "layer", "op", "name", "seq", "dtype", "shape"]
    for p in paths:
        new, old = open_capture(p), _cap(p.name)
        assert new.index[cols].equals(old.index[cols]), p.name
        assert new.run["tokens"] == old.run["tokens"], p.name
        assert new.run["arithmetic"]["aten_cpu_capability"] == "DEFAULT", p.name
        assert new.run["arithmetic"]["threads"] == 1, p.name
        for (key, a), (_, b) in zip(old, new):
            assert torch.equal(a, b), (p.name, key, str(compare(a, b)) if a.is_floating_point() else "")


def test_portable_generation_refuses_an_unpinned_process():
    from workbench.errors import WorkbenchError
    from workbench.numerics import portable

    ok, why = portable.is_portable()
    assert not ok and "ATEN_CPU_CAPABILITY" in why  # pytest itself runs with torch's own kernels
    with pytest.raises(WorkbenchError, match="portab"):
        portable.enter_portable()


def test_tp1_against_tp4_compares_logical_tensors_and_names_the_rank():
    same = compare_captures(BUNDLED / "tp1-control", BUNDLED / "tp4-control", step=0)
    assert same.grouping == "logical" and same.first_divergence() is None and same.same_keys
    assert not same.layout_notes and same.replicas.empty
    layouts = dict(zip(same.table["op"] + "/" + same.table["name"], same.table["layout_candidate"]))
    assert layouts["qsa/k"] == "tp:concat(kvh,grouped)" and layouts["gdn/v"] == "tp:concat(hv)"
    assert layouts["qsa/indices"] == "tp:replicated"
    cand = compare_captures(BUNDLED / "tp1-control", BUNDLED / "tp4-candidate", step=0)
    fd = cand.first_divergence()
    assert (fd["layer"], fd["op"], fd["name"]) == (3, "qsa", "partial_o")
    by_rank = cand.by_rank().set_index("rank")["rel_l2"]
    assert by_rank.idxmax() == 2 and by_rank.drop(2).max() < 1e-5


def test_chunked_prefill_arm_aligns_with_the_unchunked_control():
    """tp1-chunked prefills 128 + 128: aligned by (request, position) every control key is found and
    bit-identical, and the tokens agree; step by step the first chunk is taken for the prompt."""
    from workbench.analysis.tokens import token_agreement

    ctl, cand = BUNDLED / "tp1-control", BUNDLED / "tp1-chunked"
    assert _cap("tp1-chunked").run["arm"]["prefill_chunk"] == 128
    res = compare_captures(ctl, cand)
    assert res.align == "tokens" and res.first_divergence() is None
    assert set(res.table["status"]) == {"ok"} and float(res.table["rel_l2"].max()) == 0.0
    assert {"gdn/conv_state_q", "mlp/w_down"} <= set(open_capture(cand).index["op"] + "/" + open_capture(cand).index["name"])
    ds = token_agreement(ctl, cand)
    assert ds.attrs["pairing"] == "request and position" and ds.attrs["n_agree"] == ds.attrs["n_steps"] == 65
    steps = compare_captures(ctl, cand, align="steps", step=0, layer=0)
    assert steps.first_divergence() is not None  # chunk 0 against the whole prompt: a false divergence
