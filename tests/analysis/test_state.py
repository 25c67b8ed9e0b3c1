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


def _engine_capture(tmp_path, names=("state",), T=20, decode=4, whole=True):
    """GDN tensors under the op 'linear_attn' with the given state names, no metadata."""
    from workbench.capture import CaptureWriter
    from workbench.kernels import gdn

    q, k, v, g, beta = inputs(T=T + decode, H=2, K=8)
    with CaptureWriter(tmp_path / "cap", arm="x") as w:
        s = None
        for step in range(decode + 1):
            a, b = (0, T) if step == 0 else (T + step - 1, T + step)
            x = [t[:, a:b] for t in (q, k, v, g, beta)]
            _, s = gdn.recurrent(*x, initial_state=s, qk_l2norm=True)
            if whole or step > 0:
                for n, t in zip(("q", "k", "v", "g", "beta"), x):
                    w.add(t[0], step=step, layer=0, op="linear_attn", name=n)
            for n in names:
                w.add(s, step=step, layer=0, op="linear_attn", name=n)  # [B, HV, K, V]
            w.add(s[:, :, :4, 0], step=step, layer=0, op="linear_attn", name="conv_state")
    return open_capture(tmp_path / "cap"), (q, k, v, g, beta)


def test_find_state_detects_names_and_says_when_ambiguous(tmp_path):
    import pytest

    from workbench.analysis.state import find_state
    from workbench.errors import AnalysisError

    cap, _ = _engine_capture(tmp_path)
    assert find_state(cap) == ("linear_attn", "state")  # the conv state is not the recurrent state
    two, _ = _engine_capture(tmp_path / "b", names=("state", "ssm_state"))
    with pytest.raises(AnalysisError, match="several recurrent-state-like tensors.*linear_attn/ssm_state"):
        find_state(two)
    assert find_state(two, "linear_attn/ssm_state") == ("linear_attn", "ssm_state")
    with pytest.raises(AnalysisError, match="no recurrent state"):
        find_state(open_capture(CAPTURES / "hf-qwen3next-control"))  # HF keeps it in its cache object
    ds = state_drift(two, two, op="linear_attn", name="state", rank=None)
    assert ds.sizes["head"] == 2 and float(ds.rel_err_max.max()) == 0.0  # [B, HV, K, V]: heads at dim -3


def test_gdn_input_sequence_whole_prefill_or_decode_steps(tmp_path):
    from workbench.analysis.state import find_gdn_inputs, gdn_input_sequence

    cap, full = _engine_capture(tmp_path, T=20, decode=4)
    assert find_gdn_inputs(cap) == "linear_attn"
    x, s0, source = gdn_input_sequence(cap, op="linear_attn", layer=0, state=("linear_attn", "state"))
    assert s0 is None and x[0].shape == (1, 20, 2, 8) and torch.equal(x[0], full[0][:, :20])
    assert "recorded whole at step 0 (20 positions" in source
    # a prefill too short to stand alone: the decode steps from the state after it
    short, full = _engine_capture(tmp_path / "b", T=8, decode=4)
    x, s0, source = gdn_input_sequence(short, op="linear_attn", layer=0, state=("linear_attn", "state"))
    assert x[2].shape == (1, 4, 2, 8) and torch.equal(x[2], full[2][:, 8:12]) and s0.shape == (1, 2, 8, 8)
    assert torch.equal(s0, short.get(op="linear_attn", name="state", step=0))
    assert "decode steps 1..4 (4 tokens)" in source
