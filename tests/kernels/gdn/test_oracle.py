"""The FP64 oracle: recurrence and chunked form agree, and match transformers' Qwen3-Next
reference (a peer's implementation) on several shapes."""

import pytest
import torch

import workbench
from workbench.kernels.gdn import oracle
from workbench.kernels.gdn._cases import case_id, make_inputs

SHAPES = [  # B, T, H, HV, K, V, with state
    (1, 1, 1, 1, 8, 8, True),
    (2, 37, 2, 4, 16, 8, False),
    (1, 100, 2, 2, 8, 16, True),
    (1, 130, 1, 4, 16, 16, True),
]


@pytest.mark.parametrize("shape", SHAPES, ids=[case_id(*s[:6], state=s[6]) for s in SHAPES])
@pytest.mark.parametrize("chunk", [16, 64])
def test_chunked_equals_recurrent(shape, chunk):
    *dims, state = shape
    x = make_inputs(*dims, state=state, dtype=torch.float64)
    o1, s1 = oracle.recurrent(**x, qk_l2norm=True)
    o2, s2 = oracle.chunked(**x, qk_l2norm=True, chunk_size=chunk)
    assert o1.dtype == torch.float64 and s1.dtype == torch.float64
    assert workbench.compare(o1, o2).rel_l2 < 1e-12
    assert workbench.compare(s1, s2).rel_l2 < 1e-12


def test_scale_and_no_l2norm():
    x = make_inputs(1, 9, 1, 2, 8, 8, state=True)
    x["k"] = torch.nn.functional.normalize(x["k"], dim=-1)
    o1, _ = oracle.recurrent(**x, scale=0.3)
    o2, _ = oracle.chunked(**x, scale=0.3, chunk_size=4)
    assert workbench.compare(o1, o2).rel_l2 < 1e-12


PEER = [(1, 64, 2, 2, 16, 16, False), (2, 100, 2, 4, 16, 32, True), (1, 7, 1, 2, 8, 8, True)]


@pytest.mark.parametrize("shape", PEER, ids=[case_id(*s[:6], state=s[6]) for s in PEER])
def test_matches_transformers_qwen3_next(shape):
    m = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    *dims, state = shape
    x = make_inputs(*dims, state=state, seed=3)
    ref_o, ref_s = oracle.recurrent(**x, qk_l2norm=True)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    for fn, kw in ((m.torch_recurrent_gated_delta_rule, {}),
                   (m.torch_chunk_gated_delta_rule, {"chunk_size": 64})):
        o, s = fn(*args, initial_state=x["initial_state"], output_final_state=True,
                  use_qk_l2norm_in_kernel=True, **kw)
        assert workbench.compare(ref_o, o).rel_l2 < 1e-5, fn.__name__
        assert workbench.compare(ref_s, s).rel_l2 < 1e-5, fn.__name__


def test_helpers():
    a, b = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    A_log, dt = torch.randn(4), torch.randn(4)
    g, beta = oracle.gates(a, b, A_log, dt)
    assert torch.allclose(g, -A_log.double().exp() * torch.log1p((a + dt).double().exp()))
    assert (g <= 0).all() and ((beta > 0) & (beta < 1)).all()
    # conv: one call equals two calls with the rolling state carried
    x, w = torch.randn(2, 9, 5, dtype=torch.float64), torch.randn(5, 4, dtype=torch.float64)
    y, st = oracle.causal_conv1d(x, w)
    y1, st1 = oracle.causal_conv1d(x[:, :6], w)
    y2, st2 = oracle.causal_conv1d(x[:, 6:], w, state=st1)
    assert torch.allclose(torch.cat([y1, y2], 1), y) and torch.allclose(st2, st)
    # direct definition of one output
    t, d = 4, 2
    ref = sum(w[d, i] * x[0, t - 3 + i, d] for i in range(4))
    assert torch.allclose(y[0, t, d], torch.nn.functional.silu(ref))
    z = torch.randn(3, 8)
    out = oracle.gated_rmsnorm(torch.ones(3, 8), z, torch.full((8,), 2.0), 0.0)
    assert torch.allclose(out, 2 * torch.nn.functional.silu(z.double()))
