"""GDN through the native kernels of ``kernels/gdn/`` (ctypes, no torch extension toolchain).

CPU tensors run the C++ build (g++, built on first use into ``$WORKBENCH_CACHE``); CUDA tensors
run the CUDA build (nvcc, ``-gencode=arch=compute_90a,code=sm_90a`` by default) on torch's current
stream. Both compute in float32 storage with dot products accumulated in ``policy.accum_dtype``
(fp32 or fp64); the state stays float32 (``state_dtype`` other than fp32 is refused), inputs are
materialized in ``policy.input_dtype`` when set, o is rounded to ``policy.output_dtype``
(None: v's dtype). The helper ops run through the ``torch`` backend.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from workbench.errors import BackendUnavailableError, KernelArgumentError
from workbench.kernels import _native
from workbench.kernels.gdn import torch_ref
from workbench.kernels.gdn._launch import stage

__all__ = ["recurrent", "chunked", "gates", "causal_conv1d", "gated_rmsnorm", "is_available",
           "library"]

HEADERS = ["gdn/gdn_common.h"]
SOURCES = {"cpu": ["gdn/gdn_cpu.cpp"], "cuda": ["gdn/gdn_cuda.cu"]}
CUDA_K = (16, 32, 64, 128, 256)

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
_ARGS = [_P] * 7 + [_I] * 6 + [_F]


def is_available() -> tuple[bool, str]:
    if _native.find_cxx() is None:
        return False, "no C++ compiler for the CPU build (install g++ or set CXX)"
    cuda = ("nvcc found: CUDA tensors supported" if _native.find_nvcc()
            else "no nvcc: CPU tensors only")
    return True, f"native C++ build ({cuda})"


@lru_cache(maxsize=None)
def library(kind: str) -> ctypes.CDLL:
    """The built native library (``kind`` "cpu" or "cuda"), built on first use.

    Cached per process: hashing the sources on every launch would cost more than a decode step.
    """
    lib = _native.load("gdn", SOURCES[kind], kind=kind, headers=HEADERS)
    if not getattr(lib, "_gdn_typed", False):
        sfx, extra = ("cpu", []) if kind == "cpu" else ("cuda", [_P])
        rec = getattr(lib, f"gdn_recurrent_{sfx}")
        rec.argtypes, rec.restype = _ARGS + [_I] + extra, _I
        chk = getattr(lib, f"gdn_chunked_{sfx}")
        chk.argtypes, chk.restype = [_P] * 10 + [_I] * 6 + [_F, _I, _I] + extra, _I
        lib._gdn_typed = True
    return lib


def _run(op, q, k, v, g, beta, scale, initial_state, qk_l2norm, policy, chunk_size=None):
    s, p, C, tensors, state, out = stage("ext", q, k, v, g, beta, scale, initial_state,
                                         qk_l2norm, policy, chunk_size)
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=torch.float32, device=tensors[0].device)
    if s.T > 0:
        launch(op, s, C, int(p.accum_dtype == "fp64"), tensors, state, o)
    return o.to(out), state


def launch(op, s, C, acc64, tensors, state, o):
    """Run the native kernel on staged float32 contiguous tensors; ``state`` is updated in place."""
    q = tensors[0]
    kind = "cuda" if q.is_cuda else "cpu"
    if kind == "cpu" and q.device.type != "cpu":
        raise KernelArgumentError(f"q: expected a CPU or CUDA tensor for backend 'ext', got "
                                  f"device {q.device}", key="q")
    if kind == "cuda" and op == "recurrent" and s.K not in CUDA_K:
        raise KernelArgumentError(f"q: expected K in {CUDA_K} for the CUDA recurrence, got K={s.K}",
                                  key="q", fix="use backend='torch' or the chunked form")
    lib = library(kind)
    ptrs = [x.data_ptr() for x in (*tensors, o, state)]
    dims = [s.B, s.T, s.H, s.HV, s.K, s.V]
    extra = []
    if kind == "cuda":
        with torch.cuda.device(q.device):
            extra = [torch.cuda.current_stream().cuda_stream]
    if op == "recurrent":
        rc = getattr(lib, f"gdn_recurrent_{kind}")(*ptrs, *dims, s.scale, acc64, *extra)
    else:
        # workspace of the three-phase chunked form: gcum, W, U
        f32 = dict(dtype=torch.float32, device=q.device)
        ws = (torch.empty(s.B, s.HV, s.T, **f32), torch.empty(s.B, s.HV, s.T, s.K, **f32),
              torch.empty(s.B, s.HV, s.T, s.V, **f32))
        rc = getattr(lib, f"gdn_chunked_{kind}")(*ptrs, *(w.data_ptr() for w in ws), *dims,
                                                 s.scale, C, acc64, *extra)
    if rc != 0:
        raise BackendUnavailableError(f"native gdn {op} ({kind}) failed with code {rc}",
                                      key="backend", fix="see the CUDA error code; try backend='torch'")


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False, policy=None):
    return _run("recurrent", q, k, v, g, beta, scale, initial_state, qk_l2norm, policy)


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False,
            chunk_size=None, policy=None):
    return _run("chunked", q, k, v, g, beta, scale, initial_state, qk_l2norm, policy, chunk_size)


def gates(a, b, A_log, dt_bias, *, policy=None):
    return torch_ref.gates(a, b, A_log, dt_bias, policy=policy)


def causal_conv1d(x, weight, *, state=None, policy=None):
    return torch_ref.causal_conv1d(x, weight, state=state, policy=policy)


def gated_rmsnorm(x, z, weight, eps=1e-6, *, policy=None):
    return torch_ref.gated_rmsnorm(x, z, weight, eps, policy=policy)
