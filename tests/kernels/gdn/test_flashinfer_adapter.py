"""The FlashInfer backend's adapter (workbench/kernels/gdn/flashinfer.py) on the CPU, against a
stand-in for ``flashinfer.gdn_prefill.chunk_gated_delta_rule`` that keeps FlashInfer's documented
contract (packed [tokens, heads, dim] inputs and ``cu_seqlens``, log-domain gates with
``gate_domain="log"``, float32 beta, states [N, HV, V, K] written into ``output_state``, rows of
empty sequences left unwritten) and computes with the FP64 oracle: what the adapter packs,
transposes and gives back is checked, not FlashInfer's kernel (that is the GPU test's)."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import workbench
from workbench.errors import KernelArgumentError
from workbench.kernels.gdn import flashinfer as fi_adapter
from workbench.kernels.gdn import oracle
from workbench.kernels.gdn._cases import make_inputs, packed_inputs


def _stand_in(calls: list):
    def chunk_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                               output_final_state=False, cu_seqlens=None, use_qk_l2norm_in_kernel=False,
                               output=None, output_state=None, max_seqlen=None, *, gate_domain="linear",
                               **rest):
        assert not rest, rest
        assert q.dim() == 3 and k.dim() == 3 and v.dim() == 3 and q.is_contiguous()
        assert gate_domain == "log" and g.dtype == torch.float32 and beta.dtype == torch.float32
        assert cu_seqlens.dtype == torch.int32 and output_final_state and output_state is not None
        offs = cu_seqlens.tolist()
        assert max_seqlen >= max(b - a for a, b in zip(offs, offs[1:]))
        calls.append({"offs": offs, "max_seqlen": max_seqlen, "scale": scale})
        o = torch.zeros(q.shape[0], v.shape[1], v.shape[2], dtype=q.dtype)
        for i, (a, b) in enumerate(zip(offs, offs[1:])):
            if a == b:
                continue  # an empty sequence: its row of output_state is left as it is
            s0 = initial_state[i].transpose(-1, -2)[None]  # FlashInfer's [HV, V, K] -> ours
            oi, si = oracle.chunked(q[None, a:b], k[None, a:b], v[None, a:b], g[None, a:b], beta[None, a:b],
                                    scale=scale, initial_state=s0, qk_l2norm=use_qk_l2norm_in_kernel)
            o[a:b] = oi[0].to(q.dtype)
            output_state[i] = si[0].transpose(-1, -2).float()
        return o, output_state

    mod = types.ModuleType("flashinfer.gdn_prefill")
    mod.chunk_gated_delta_rule = chunk_gated_delta_rule
    pkg = types.ModuleType("flashinfer")
    pkg.gdn_prefill = mod
    pkg.__version__ = "stand-in"
    return pkg, mod


@pytest.fixture
def stand_in(monkeypatch):
    calls: list = []
    pkg, mod = _stand_in(calls)
    monkeypatch.setitem(sys.modules, "flashinfer", pkg)
    monkeypatch.setitem(sys.modules, "flashinfer.gdn_prefill", mod)
    fi_adapter._fi.cache_clear()
    yield calls
    fi_adapter._fi.cache_clear()


def _close(a, b, tol=1e-6):
    return workbench.compare(a.double(), b.double()).rel_l2 <= tol


O_TOL = 4e-3  # o comes back in q's dtype (bf16): the stand-in's o is the oracle's rounded to it


def test_a_batch_goes_as_packed_sequences_and_comes_back_in_our_layouts(stand_in):
    x = make_inputs(2, 70, 2, 4, 32, 32, dtype=torch.bfloat16, state=True, seed=3)
    o, st = fi_adapter.chunked(**x, qk_l2norm=True)
    ro, rs = oracle.chunked(**x, qk_l2norm=True)
    assert o.shape == ro.shape and st.shape == rs.shape and o.dtype == torch.bfloat16
    assert _close(o, ro, O_TOL) and _close(st, rs)
    assert stand_in == [{"offs": [0, 70, 140], "max_seqlen": 70, "scale": 32 ** -0.5}]
    # the state's orientation matters: these inputs' states are far from symmetric
    assert not _close(st, rs.transpose(-1, -2), 1e-2)


def test_a_packed_batch_with_empty_and_one_token_sequences(stand_in):
    lengths = [0, 1, 65, 0, 9]
    p = packed_inputs(lengths, H=2, HV=4, K=32, V=32, dtype=torch.bfloat16, seed=5)
    o, st = fi_adapter.chunked(**p)
    ro, rs = oracle.chunked(**p)
    assert _close(o, ro, O_TOL) and _close(st, rs)
    # the empty sequences' final states are their initial states (the kernel leaves their rows)
    for i in (0, 3):
        assert torch.equal(st[i], p["initial_state"][i].float())
    assert stand_in[0]["offs"] == [0, 0, 1, 66, 66, 75] and stand_in[0]["max_seqlen"] == 65


def test_no_initial_state_is_zeros_and_no_tokens_calls_nothing(stand_in):
    x = make_inputs(1, 40, 1, 2, 16, 16, dtype=torch.float16, state=False, seed=2)
    o, st = fi_adapter.chunked(**x)
    ro, rs = oracle.chunked(**x)
    assert _close(o, ro, O_TOL) and _close(st, rs)
    p = packed_inputs([0, 0], H=1, HV=2, K=16, V=16, dtype=torch.bfloat16, seed=1)
    o, st = fi_adapter.chunked(**p)
    assert o.shape == (1, 0, 2, 16) and torch.equal(st, p["initial_state"].float())
    assert len(stand_in) == 1


def test_one_head_size_for_keys_and_values_and_16_bit_inputs(stand_in):
    """K != V refused; float32 q, k, v refused unless the policy materializes them in bf16."""
    x = make_inputs(1, 20, 1, 2, 32, 16, dtype=torch.bfloat16, state=True, seed=2)
    with pytest.raises(KernelArgumentError, match="one head size"):
        fi_adapter.chunked(**x)
    x = make_inputs(1, 20, 1, 2, 16, 16, dtype=torch.float32, state=True, seed=2)
    with pytest.raises(KernelArgumentError, match="bf16 or fp16"):
        fi_adapter.chunked(**x)
    assert stand_in == []
    # float32 inputs with the policy's input rounding point: q, k, v run in bf16
    from workbench.numerics.policy import Policy
    o, st = fi_adapter.chunked(**x, qk_l2norm=True, policy=Policy(input_dtype="bf16"))
    ro, rs = oracle.chunked(**{**x, **{n: x[n].bfloat16() for n in ("q", "k", "v")}}, qk_l2norm=True)
    assert o.dtype == torch.bfloat16 and _close(o, ro, O_TOL) and _close(st, rs)


def test_listed_with_the_reason_it_cannot_run_here():
    from workbench.kernels import backends
    row = backends("gdn").set_index("name").loc["flashinfer"]
    if not torch.cuda.is_available():
        assert not row["available"] and row["reason"]


@pytest.mark.gpu
def test_gpu_flashinfer_backend_against_fp64():
    """On the GPU with FlashInfer installed: ``gdn.chunked(..., backend="flashinfer")`` through
    the public call, a batch and a packed batch with empty and one-token sequences, the q/k norm
    in the kernel, bf16 inputs: o and the final states near the FP64 oracle (FlashInfer's bf16
    intermediates: rel L2 a few 1e-3) and near ours (ext)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    pytest.importorskip("flashinfer.gdn_prefill", reason="FlashInfer is not installed")
    from workbench.kernels import gdn
    fi_adapter._fi.cache_clear()
    x = {n: t.cuda() for n, t in make_inputs(2, 300, 2, 4, 128, 128, dtype=torch.bfloat16, state=True,
                                                seed=11).items()}
    p = {n: (t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in
         packed_inputs([0, 1, 200, 0, 129], H=2, HV=4, K=128, V=128, dtype=torch.bfloat16, seed=12).items()}
    for inputs in (x, p):
        ro, rs = oracle.chunked(**inputs, qk_l2norm=True)
        o, st = gdn.chunked(**inputs, qk_l2norm=True, backend="flashinfer")
        eo, es = gdn.chunked(**inputs, qk_l2norm=True, backend="ext")
        assert o.shape == eo.shape and st.shape == es.shape and o.dtype == eo.dtype
        assert workbench.compare(ro.cpu(), o.double().cpu()).rel_l2 <= 1e-2
        assert workbench.compare(rs.cpu(), st.double().cpu()).rel_l2 <= 1e-2
        assert workbench.compare(eo.float().cpu(), o.float().cpu()).rel_l2 <= 1e-2
    for i in (0, 3):  # the packed batch's empty sequences keep their initial states
        assert torch.equal(st[i], p["initial_state"][i].float())


def test_benchmark_rows_with_a_refused_shape(tmp_path, monkeypatch, stand_in):
    """benchmarks/gdn_flashinfer.py on the CPU with the GPU parts replaced (timing, graphs, the
    shapes' calls): a shape FlashInfer refuses still has ours and fla timed, is named in the
    summary, and the others compare FlashInfer's o and state (transposed back) with ours."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "benchmarks" / "gdn_flashinfer.py"
    spec = importlib.util.spec_from_file_location("gdn_flashinfer", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    fake = sys.modules["flashinfer.gdn_prefill"]
    real = fake.chunk_gated_delta_rule

    def refusing(q, *a, **kw):
        if q.shape[-1] != 32:
            raise RuntimeError(f"DSL kernel only supports D=32, got {q.shape[-1]}")
        return real(q, *a, **kw)

    monkeypatch.setattr(fake, "chunk_gated_delta_rule", refusing)

    def calls(chunk, B, T, H, HV, K, V, norm, keep=None):
        x = make_inputs(B, T, H, HV, K, V, dtype=torch.float32, state=True, seed=B + K)
        keep.update(x, cu_seqlens=None)

        def ours():
            return oracle.chunked(**x, qk_l2norm=norm)
        return ours, ours, None, T, x["q"].dtype

    times = iter(range(1, 1000))
    monkeypatch.setattr(bench, "PREFILL", [("d32", 2, 70, 1, 2, 32, 32, True), ("d16", 1, 40, 1, 2, 16, 16, False)])
    monkeypatch.setattr(bench, "prefill_calls", calls)
    monkeypatch.setattr(bench, "_fla", lambda: (None, None))
    monkeypatch.setattr(bench, "_graphed", lambda fn: fn)
    monkeypatch.setattr(bench, "_bench", lambda fn: float(next(times)))
    monkeypatch.setattr(bench.site, "addsitedir", lambda d: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "stand-in")
    out = tmp_path / "fi.json"
    monkeypatch.setattr(sys, "argv", ["gdn_flashinfer.py", "--site", str(tmp_path), "--out", str(out),
                                      "--accuracy"])
    bench.main()
    result = json.loads(out.read_text())
    rows = {r["shape"]: r for r in result["rows"]}
    assert result["summary"]["flashinfer_refused"] == ["d16"]
    assert result["summary"]["min_flashinfer_over_ours"] == rows["d32"]["flashinfer_over_ours"]
    assert rows["d16"]["flashinfer_timing"].startswith("refused (RuntimeError: DSL kernel only supports D=32")
    assert "ms_flashinfer" not in rows["d16"] and rows["d16"]["ms_ours"] > 0 and rows["d16"]["ms_fla"] > 0
    assert rows["d32"]["flashinfer_timing"] == "graphed" and rows["d32"]["ms_flashinfer"] > 0
    assert rows["d32"]["rel_l2_state_ours_vs_flashinfer"] < 1e-6
    assert rows["d32"]["rel_l2_o_ours_vs_flashinfer"] < 1e-6
    assert rows["d32"]["rel_l2_state_flashinfer_vs_fp64"] < 1e-6
