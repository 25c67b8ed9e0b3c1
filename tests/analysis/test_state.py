from pathlib import Path

import torch

from workbench.analysis import chunked_continuation, prefill_decode_handoff, state_drift, state_evolution
from workbench.capture import open_capture
from workbench.numerics.policy import Policy

CAPTURES = Path(__file__).resolve().parents[2] / "captures"


def inputs(T=128, H=2, K=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, T, H, K, generator=g) for _ in range(3))
    return q, k, v, -0.01 * torch.rand(1, T, H, generator=g), torch.rand(1, T, H, generator=g)


def test_bf16_state_drift_grows_synthetic():
    ds = state_evolution(*inputs(), policy=Policy(state_dtype="bf16"))
    assert ds.err_oracle.dims == ("step", "head")
    assert ds.attrs["growth"] > 1.5 and ds.attrs["trend"] > 0.8
    assert float(ds.control_err_oracle.max()) < 1e-5 < float(ds.err_oracle.max())


def test_chunked_continuation_and_handoff():
    ds = chunked_continuation(*inputs(), split=64)
    assert float(ds.state_err.max()) < 1e-5 and float(ds.between.max()) < 1e-5
    h = prefill_decode_handoff(*inputs(T=80), prefill_len=64)
    assert float(h.out_err.max()) < 1e-4 and (h.phase.values == "decode").sum() == 16


def test_bundled_bf16_state_drift_grows():
    ds = state_drift(CAPTURES / "candidate-bf16-state", CAPTURES / "control")
    assert ds.attrs["growing"] and ds.attrs["trend"] > 0.5
    same = state_drift(CAPTURES / "control-repeat", CAPTURES / "control")
    assert float(same.rel_err_max.max()) < float(ds.rel_err_max.max()) / 10
