"""torch backend: every policy rounding point it honours (against the oracle: tests/kernels/test_conformance.py)."""

import torch

import workbench
from workbench.kernels import gdn
from workbench.kernels.gdn import oracle, torch_ref
from workbench.kernels.gdn._cases import make_inputs
from workbench.numerics.policy import Policy, use_policy



def test_prefill_continuation_and_decode():
    x = make_inputs(1, 136, 2, 4, 16, 16, state=True, seed=2)
    part = lambda d, sl: {k: (v[:, sl] if k != "initial_state" else None) for k, v in d.items()}
    o_all, s_all = gdn.chunked(**x, qk_l2norm=True, chunk_size=128)
    # 64 + 64 with the state carried == one chunked call over 128
    o1, s1 = gdn.chunked(**{**part(x, slice(0, 64)), "initial_state": x["initial_state"]},
                         qk_l2norm=True, chunk_size=64)
    o2, s2 = gdn.chunked(**{**part(x, slice(64, 128)), "initial_state": s1}, qk_l2norm=True,
                         chunk_size=64)
    o12, _ = gdn.chunked(**{**part(x, slice(0, 128)), "initial_state": x["initial_state"]},
                         qk_l2norm=True, chunk_size=128)
    assert workbench.compare(o12, torch.cat([o1, o2], 1)).rel_l2 < 1e-5
    # prefill 128 then 8 decode steps == one long recurrence
    s = s2
    outs = []
    for t in range(128, 136):
        o, s = gdn.recurrent(**{**part(x, slice(t, t + 1)), "initial_state": s}, qk_l2norm=True)
        outs.append(o)
    assert workbench.compare(o_all[:, 128:], torch.cat(outs, 1)).rel_l2 < 1e-5
    assert workbench.compare(s_all, s).rel_l2 < 1e-5


def test_bf16_state_drifts_further_than_fp32():
    x = make_inputs(1, 256, 1, 2, 32, 32, state=True, seed=4)
    ref_o, ref_s = oracle.recurrent(**x, qk_l2norm=True)
    err = {}
    for sd in ("fp32", "bf16", "fp16"):
        o, s = gdn.recurrent(**x, qk_l2norm=True, policy=Policy(state_dtype=sd))
        err[sd] = workbench.compare(ref_s, s).rel_l2
        # state values are representable in the storage dtype
        assert torch.equal(s, s.to(getattr(torch, {"fp32": "float32", "bf16": "bfloat16",
                                                   "fp16": "float16"}[sd])).float())
    assert err["fp32"] < 1e-5
    assert err["bf16"] > 50 * err["fp32"] and err["bf16"] > 1e-3
    assert err["fp32"] < err["fp16"] < err["bf16"]


def test_chunk_state_rounding_and_chunk_size_knob():
    x = make_inputs(1, 96, 1, 1, 16, 16, seed=5)
    ref_o, ref_s = oracle.recurrent(**x, qk_l2norm=True)
    # bf16 state rounded at chunk boundaries only: fewer roundings than per step
    with use_policy(state_dtype="bf16"):
        _, s_rec = gdn.recurrent(**x, qk_l2norm=True)
        _, s_c32 = gdn.chunked(**x, qk_l2norm=True)
        _, s_c16 = gdn.chunked(**x, qk_l2norm=True, policy=Policy(state_dtype="bf16", chunk_size=16))
    e = lambda s: workbench.compare(ref_s, s).rel_l2
    assert e(s_c32) < e(s_rec)
    assert e(s_c32) != e(s_c16)  # the chunk_size knob changes where the state is rounded


def test_input_accum_output_knobs():
    x = make_inputs(1, 20, 1, 2, 16, 16, seed=6)
    ref_o, _ = oracle.recurrent(**x, qk_l2norm=True)
    e = lambda p: workbench.compare(ref_o, gdn.recurrent(**x, qk_l2norm=True, policy=p)[0]).rel_l2
    assert e(Policy(accum_dtype="fp64", state_dtype="fp64", output_dtype="fp64")) < 1e-12
    assert 1e-9 < e(Policy(accum_dtype="fp64")) < 1e-6  # fp32 state and output still round
    assert e(Policy(input_dtype="bf16")) > 1e-4
    o, _ = gdn.recurrent(**x, qk_l2norm=True, policy=Policy(output_dtype="bf16"))
    assert o.dtype == torch.bfloat16


def test_helpers_against_oracle():
    a, b = torch.randn(2, 5, 4), torch.randn(2, 5, 4)
    A_log, dt = torch.randn(4), torch.randn(4)
    for got, ref in zip(gdn.gates(a, b, A_log, dt), oracle.gates(a, b, A_log, dt)):
        assert got.dtype == torch.float32 and workbench.compare(ref, got).rel_l2 < 1e-6
    x, w, st = torch.randn(2, 6, 8), torch.randn(8, 4), torch.randn(2, 8, 3)
    (y, s), (yr, sr) = gdn.causal_conv1d(x, w, state=st), oracle.causal_conv1d(x, w, state=st)
    assert workbench.compare(yr, y).rel_l2 < 1e-6 and torch.equal(s, sr.float())
    x, z, w = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(3, 16), torch.rand(16) + 0.5
    y = gdn.gated_rmsnorm(x, z, w, 1e-6)
    assert y.dtype == torch.bfloat16
    assert workbench.compare(oracle.gated_rmsnorm(x, z, w, 1e-6), y).rel_l2 < 5e-3
    assert torch_ref.is_available()[0]


def test_gated_rmsnorm_rounds_the_normalized_value_to_x_dtype():
    # Qwen3-Next's RMSNormGated: normalize in fp32, round to x's dtype (bf16), then scale and gate.
    # Written independently in float64 with that one rounding, the result agrees bit for bit;
    # without the intermediate rounding only about 3/4 of the elements would.
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 128, generator=g).bfloat16()
    z, w = torch.randn(64, 128, generator=g), torch.rand(128, generator=g) + 0.5
    y = gdn.gated_rmsnorm(x, z, w, 1e-6)
    x64 = x.double()
    h = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
    want = (w.double() * h.to(torch.bfloat16).double() * F.silu(z.double())).to(torch.bfloat16)
    unrounded = (w.double() * h * F.silu(z.double())).to(torch.bfloat16)
    assert (y == want).double().mean().item() > 0.995
    assert (unrounded == want).double().mean().item() < 0.9  # the check can tell the two apart
