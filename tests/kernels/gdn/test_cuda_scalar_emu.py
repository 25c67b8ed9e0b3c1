"""The CUDA build's scalar GDN kernels (kernels/gdn/gdn_cuda.cu: the recurrence for prefill and
batched decode, the three-launch chunked form) run on the CPU under the host emulation of CUDA
(workbench.kernels.gdn.cuda_emu): against the oracle, and the contracts the GPU tests check (a
chain of decode steps = one prefill call, 16-bit reads = their float32 widening, the chunked form
= the CPU build's element code, bit for bit)."""

from __future__ import annotations

import pytest
import torch

import workbench
from workbench.kernels import _native
from workbench.kernels.gdn import cuda_emu, ext, oracle
from workbench.kernels.gdn._cases import make_inputs

pytestmark = pytest.mark.skipif(_native.find_cxx() is None, reason="no C++ compiler")


@pytest.mark.parametrize("acc", ["fp32", "fp64"])
@pytest.mark.parametrize("K,V,dtype", [(16, 8, torch.float32), (64, 48, torch.bfloat16),
                                       (128, 32, torch.float16), (256, 40, torch.bfloat16)])
def test_emulated_recurrence_against_oracle(K, V, dtype, acc):
    """Every K the CUDA recurrence takes, a partly idle column tile (V not a multiple of 32)."""
    x = make_inputs(2, 23, 2, 4, K, V, dtype=dtype, state=True, seed=K + V)
    o, s = cuda_emu.recurrent(**x, qk_l2norm=True, accum_dtype=acc)
    ro, rs = oracle.recurrent(**x, qk_l2norm=True)
    assert o.dtype == dtype and s.dtype == torch.float32
    tol = 1e-5 if dtype == torch.float32 else 5e-3  # o rounded to its 16-bit dtype
    assert workbench.compare(ro, o).rel_l2 <= tol and workbench.compare(rs, s).rel_l2 <= 1e-5


def test_emulated_decode_steps_equal_one_prefill_call():
    """T calls of one step, the state carried in float32, = one call of T steps (the kernel keeps
    the state in float32 registers between steps), o and state bit for bit."""
    x = make_inputs(3, 17, 2, 4, 128, 64, dtype=torch.bfloat16, state=True, seed=5)
    o, s = cuda_emu.recurrent(**x, qk_l2norm=True)
    st, outs = x["initial_state"], []
    for t in range(17):
        step = {n: (v[:, t:t + 1] if n != "initial_state" else st) for n, v in x.items()}
        ot, st = cuda_emu.recurrent(**step, qk_l2norm=True)
        outs.append(ot)
    assert torch.equal(torch.cat(outs, 1), o) and torch.equal(st, s)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_emulated_recurrence_reads_16bit_as_widened(dtype):
    x = make_inputs(1, 9, 1, 2, 64, 32, dtype=dtype, state=True, seed=7)
    wide = {**x, **{n: x[n].float() for n in ("q", "k", "v")}}
    o16, s16 = cuda_emu.recurrent(**x, output_dtype=torch.float32)
    o32, s32 = cuda_emu.recurrent(**wide, output_dtype=torch.float32)
    assert torch.equal(o16, o32) and torch.equal(s16, s32)


def test_emulated_recurrence_without_initial_state():
    x = make_inputs(1, 5, 1, 2, 32, 32, dtype=torch.float32, state=False, seed=8)
    x.pop("initial_state", None)
    o, s = cuda_emu.recurrent(**x)
    o0, s0 = cuda_emu.recurrent(**x, initial_state=torch.zeros(1, 2, 32, 32))
    assert torch.equal(o, o0) and torch.equal(s, s0)


@pytest.mark.parametrize("acc", ["fp32", "fp64"])
def test_emulated_scalar_chunked_is_the_cpu_build(acc):
    """The CUDA build's chunked form runs the CPU build's element code (gdn_common.h) with its
    phases split over threads: the same bits as the CPU build, and the oracle's values."""
    x = make_inputs(2, 150, 2, 4, 64, 32, dtype=torch.float32, state=True, seed=4)
    o, s = cuda_emu.chunked(**x, qk_l2norm=True, accum_dtype=acc)
    co, cs = ext.chunked(**x, qk_l2norm=True, policy=workbench.Policy(accum_dtype=acc))
    assert torch.equal(co, o) and torch.equal(cs, s)
    ro, rs = oracle.chunked(**x, qk_l2norm=True)
    assert workbench.compare(ro, o).rel_l2 <= 1e-5 and workbench.compare(rs, s).rel_l2 <= 1e-5


@pytest.mark.gpu
def test_emulated_recurrence_matches_the_gpu():
    """The emulation against the kernel on the GPU: the same to the device's expf."""
    from workbench.kernels import gdn
    x = make_inputs(2, 40, 2, 4, 128, 64, dtype=torch.bfloat16, state=True, seed=9)
    eo, es = cuda_emu.recurrent(**x, qk_l2norm=True, output_dtype=torch.float32)
    go, gs = gdn.recurrent(**{n: t.cuda() for n, t in x.items()}, qk_l2norm=True, backend="ext",
                           policy=workbench.Policy(output_dtype="fp32"))
    assert workbench.compare(eo, go.cpu()).rel_l2 <= 1e-5 and workbench.compare(es, gs.cpu()).rel_l2 <= 1e-5


def test_emulated_failure_keeps_the_error_and_adds_the_reason():
    """A failed emulated launch raises the launch's own error (type, key, fix) with the emulation's
    reason added; without a reason, the error as it was; CUDA tensors are refused."""
    from workbench.errors import BackendUnavailableError, KernelArgumentError
    from workbench.kernels.gdn import _emu

    class Lib:  # a build whose last launch failed, or did not
        def __init__(self, why):
            self.why = why

        def wb_emu_last_failure(self):
            return self.why

    err = BackendUnavailableError("native gdn chunked (cuda) failed: cudaErrorLaunchFailure (status 719)",
                                  key="backend", fix="see the status name")
    with pytest.raises(BackendUnavailableError) as e:
        with _emu.explained(Lib(b"deadlock: block (0, 0) warp 3 waits at barrier 1")):
            raise err
    assert e.value.message == f"{err.message}; emulation: deadlock: block (0, 0) warp 3 waits at barrier 1"
    assert (e.value.key, e.value.fix, e.value.__cause__) == ("backend", "see the status name", err)
    with pytest.raises(BackendUnavailableError) as e:
        with _emu.explained(Lib(b"")):
            raise err
    assert e.value is err
    if torch.cuda.is_available():
        with pytest.raises(KernelArgumentError, match="CPU tensors"):
            _emu.require_cpu(torch.zeros(1, device="cuda"))
    _emu.require_cpu(torch.zeros(1), None)
