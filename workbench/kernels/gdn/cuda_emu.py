"""The CUDA build's scalar GDN kernels run on the CPU, for tests on machines without a GPU.

``kernels/gdn/gdn_cuda_emu.cpp`` builds ``kernels/gdn/gdn_cuda.cu`` (the recurrence, used for
prefill and batched decode, and the three-launch scalar chunked form) for the host under the
emulation of CUDA in ``kernels/common/cuda_emu.h`` (see :mod:`workbench.kernels.gdn.mma_emu`,
which does the same for the tensor-core path). The kernels and launchers are the file's own; the
CUDA build's SASS is unchanged by the emulation's hooks. Arithmetic in float32 (or float64
accumulators) with the host's ``expf``: the GPU's results to the last bits of the exponentials.
"""

from __future__ import annotations

import ctypes

import torch

from workbench.kernels import _abi, _native
from workbench.kernels._abi import GdnArgs
from workbench.kernels.gdn import ext
from workbench.kernels.gdn._emu import bind_failure, explained, require_cpu
from workbench.kernels.gdn._launch import empty_result, stage, stage_direct
from workbench.numerics.policy import Policy

SOURCES = ["gdn/gdn_cuda_emu.cpp"]
HEADERS = [*ext.HEADERS, "gdn/gdn_cuda.cu", "common/cuda_emu.h"]

__all__ = ["recurrent", "chunked", "library"]

_lib = None


def library() -> ctypes.CDLL:
    """The emulated build (g++; cached like the other native builds)."""
    global _lib
    if _lib is None:
        lib = _native.load("gdn_cuda_emu", SOURCES, kind="cpu", headers=HEADERS)
        _abi.bind(lib, {"gdn_recurrent_cuda": GdnArgs, "gdn_chunked_cuda": GdnArgs})
        _abi.check_layout(lib, GdnArgs)
        bind_failure(lib)
        _lib = lib
    return _lib


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False,
              accum_dtype: str = "fp32", output_dtype: torch.dtype | None = None):
    """``gdn.recurrent`` on the CUDA recurrence kernel, emulated: q, k, v (one dtype), g and beta in
    float32 / bf16 / fp16 read as given, ``qk_l2norm`` applied in the kernel, o in
    ``output_dtype`` (None: v's dtype); (o, final state)."""
    require_cpu(q, k, v, g, beta, initial_state)
    p = Policy(accum_dtype=accum_dtype)
    s, tensors, h0, state, o, out = stage_direct(q, k, v, g, beta, scale, initial_state, p)
    if output_dtype is not None:
        out = output_dtype
        o = torch.empty(s.B, s.T, s.HV, s.V, dtype=out)
    if s.T == 0 or s.B == 0:
        return o.to(out), empty_result(h0, state)
    lib = library()
    with explained(lib):
        ext.launch("recurrent", s, 0, int(accum_dtype == "fp64"), tensors, state, o,
                   qk_l2norm=qk_l2norm, h0=h0, zero_state=h0 is None, lib=lib)
    return o.to(out), state


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False, chunk_size=64,
            accum_dtype: str = "fp32"):
    """``gdn.chunked`` on the CUDA build's scalar path (three launches, float32 storage), emulated:
    q and k normalized first when ``qk_l2norm`` (as ``ext.staged`` does off the mma path);
    (o float32, final state)."""
    require_cpu(q, k, v, g, beta, initial_state)
    p = Policy(accum_dtype=accum_dtype)
    s, _, C, tensors, state, _ = stage("ext", q, k, v, g, beta, scale, initial_state, bool(qk_l2norm), p,
                                       chunk_size)
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=torch.float32)
    if s.T == 0:
        return o, state
    lib = library()
    with explained(lib):
        ext.launch("chunked", s, C, int(accum_dtype == "fp64"), tensors, state, o, lib=lib)
    return o, state
