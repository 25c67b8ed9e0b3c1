"""The CUDA mma path's kernels run on the CPU, for tests on machines without a GPU.

``kernels/gdn/gdn_mma_emu.cpp`` builds ``kernels/gdn/gdn_mma.cu`` (the same kernels and launchers;
only the helpers around its PTX differ) for the host with g++ under the emulation of
``kernels/common/cuda_emu.h``: every CUDA thread of a block is a fiber, barriers, warp shuffles,
``mma.sync`` (tf32, m16n8k8), ``ldmatrix`` and ``cp.async`` behave as the PTX says. So the
passes' indexing, their exchanges over shared memory and barriers, the packed launch's tables and
the workspace layout run here as they would on a GPU, and a deadlock or a stage read before its
copy landed shows as a failure or a wrong result.

Not a backend and not a speed: a block of 256 threads runs as 256 fibers on one core (seconds
for a few chunks). An ``mma``'s eight products are added to its accumulator one by one in
float32 (the tensor cores round their sums otherwise) and ``expf`` is the host's, so results
match the GPU's to float32 rounding, not bit for bit; comparisons between the kernels' own paths (a pass against another
whose products and order are the same, a packed batch against its sequences alone) are exact
here as they are on the GPU.

``WB_EMU_CP=eager`` lands each ``cp.async`` at issue instead of when its thread waits (both are
legal): run both to catch a copy into a buffer still being read as well as a read before the
wait. ``WB_EMU_SMS`` is the emulated device's SM count (132), which the launcher's choice of pass
reads; ``WORKBENCH_GDN_MMA_PASS`` forces a pass as on the GPU.
"""

from __future__ import annotations

import ctypes
import os

import torch

from workbench.errors import KernelArgumentError
from workbench.kernels import _abi, _native
from workbench.kernels._abi import GdnArgs
from workbench.kernels.gdn import ext
from workbench.kernels.gdn._emu import bind_failure, explained, require_cpu
from workbench.kernels.gdn._launch import empty_result, stage, state_source
from workbench.kernels.gdn._varlen import check_packed
from workbench.numerics.policy import Policy

SOURCES = ["gdn/gdn_mma_emu.cpp"]
HEADERS = [*ext.HEADERS, "gdn/gdn_mma.cu", "common/cuda_emu.h"]

__all__ = ["chunked", "library", "pass_of"]

_lib = None


def library(lib: ctypes.CDLL | None = None) -> ctypes.CDLL:
    """The emulated build (g++; cached like the other native builds); or ``lib``, another build of
    ``gdn_mma_emu.cpp`` (a test's variant of the kernels), typed for :func:`chunked`."""
    global _lib
    if lib is None and _lib is not None:
        return _lib
    if lib is None or not getattr(lib, "_emu_typed", False):
        own = lib is None
        lib = lib or _native.load("gdn_mma_emu", SOURCES, kind="cpu", headers=HEADERS)
        _abi.bind(lib, {"gdn_chunked_mma_cuda": GdnArgs})
        _abi.check_layout(lib, GdnArgs)
        lib.gdn_chunked_mma_varlen_cuda.argtypes = [ctypes.POINTER(GdnArgs), ctypes.c_void_p, ctypes.c_int]
        lib.gdn_chunked_mma_varlen_cuda.restype = ctypes.c_int
        lib.gdn_mma_pass_plan.argtypes = [ctypes.c_int] * 5
        lib.gdn_mma_pass_plan.restype = ctypes.c_int
        lib.gdn_mma_packed_pass_plan.argtypes = [ctypes.c_void_p] + [ctypes.c_int] * 7
        lib.gdn_mma_packed_pass_plan.restype = ctypes.c_int
        bind_failure(lib)
        lib._emu_typed = True
        if own:
            _lib = lib
    return lib


def pass_of(B: int, HV: int, V: int, dtype: torch.dtype, sms: int | None = None, *,
            K: int = 128) -> str:
    """The pass the emulated launcher takes (as ``ext.mma_pass`` names them) on ``sms`` SMs (None:
    the emulated device's, ``WB_EMU_SMS`` or 132)."""
    if sms is None:
        sms = int(os.environ.get("WB_EMU_SMS") or 132)
    return ext.pass_name(library().gdn_mma_pass_plan(int(B) * int(HV), int(K), int(V),
                                                     ext.elem_kind(dtype), int(sms)))


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False, cu_seqlens=None,
            output_dtype: torch.dtype | None = None, lib: ctypes.CDLL | None = None):
    """``gdn.chunked`` on the mma path's kernels, emulated: CPU tensors in, (o, final state) out.

    q, k, v: float32, bf16 or fp16 (all three alike; read as given, as on the GPU); chunk 64, K in
    (64, 128), V in (32, 64, 96, 128). o in ``output_dtype`` (None: v's dtype; float32, bf16 or
    fp16, written by the kernel). ``cu_seqlens``: a packed batch (B = 1, one state per sequence)
    in one launch pair per 128 sequences, as on the GPU. ``lib``: another build (:func:`library`).
    """
    require_cpu(q, k, v, g, beta, initial_state)
    offs = None
    if cu_seqlens is not None:
        offs = check_packed(q, k, v, cu_seqlens, initial_state)
    s, _, C, tensors, _, out = stage("ext", q, k, v, g, beta, scale,
                                     None if offs is not None else initial_state, False,
                                     Policy(), None, widen=False, state=False)
    # as the public call on the GPU: the initial state read where it lies (h0; None: zeros), the
    # final state written to a new tensor
    h0 = state_source(initial_state)
    n = s.B if offs is None else len(offs) - 1
    state = torch.full((n, s.HV, s.K, s.V), float("nan"), dtype=torch.float32)
    out = output_dtype or out
    if out not in ext.MMA_OUT:
        raise KernelArgumentError(f"output_dtype: the mma path writes {list(ext.MMA_OUT)}, got {out}",
                                  key="output_dtype")
    o = torch.full((s.B, s.T, s.HV, s.V), float("nan"), dtype=out)
    if s.T == 0:
        return o, empty_result(h0, state)
    lib = library(lib)
    with explained(lib):
        ext.launch("chunked", s, C, 0, tensors, state, o, path="mma", qk_l2norm=bool(qk_l2norm),
                   cu_seqlens=offs, lib=lib, h0=h0, zero_state=h0 is None)
    return o, state
