"""Split-K GEMM in native code (kernels/gemm): C++ on CPU tensors, CUDA on GPU tensors.

Layers: ``splitk_partials_kernel``/``splitk_reduce_kernel`` (``gemm_cuda.cu``) or the loops of
``gemm_cpu.cpp`` -> ``_launch`` -> :func:`workbench.kernels.gemm.splitk_matmul`. Partials are
rounded to ``partial_dtype`` and held in an fp32 buffer (the values a ``partial_dtype`` store
would hold); at most 64 splits; the CUDA kernel takes M in chunks of 16 rows.

On GPU tensors the CUDA build has two partial kernels (``gemm_cuda.cu``): ``splitk_mma_kernel``
(tensor cores, mma.sync m16n8k16 with fp32 results) and ``splitk_partials_kernel`` (CUDA cores,
plain fp32 multiply and add). The path is chosen automatically: tensor cores for bf16/fp16
inputs, CUDA cores for fp32 inputs. The environment variable ``WORKBENCH_GEMM_CUDA_PATH``
(read at every call) overrides it: ``auto`` (default), ``scalar`` (CUDA cores for every dtype) or
``mma`` (tensor cores; an error for fp32 inputs). Both keep the split-K contract: slices of
``ceil(K / splits)`` columns, each summed in fp32, rounded once to ``partial_dtype``, the partials
reduced in ``order``. On the tensor-core path the order of accumulation inside a slice is the
hardware's (16-product blocks, see docs/kernels/gemm.md), not the CPU build's k-ascending loop.
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache

import torch

from workbench.errors import BackendUnavailableError
from workbench.kernels import _native
from workbench.numerics.dtypes import canonical, torch_dtype

OPS = ("splitk_matmul",)

__all__ = ["splitk_matmul", "is_available", "cuda_path", "PATH_ENV"]

_DT = {"fp32": 0, "bf16": 1, "fp16": 2}
_HDR = ["gemm/gemm_elem.h", "qsa/qsa_elem.h"]
PATH_ENV = "WORKBENCH_GEMM_CUDA_PATH"
_PATHS = {"auto": 0, "scalar": 1, "mma": 2}


def cuda_path(dtype) -> str:
    """The CUDA partial kernel a GPU call with inputs of ``dtype`` uses: ``"mma"`` (tensor cores)
    or ``"scalar"`` (CUDA cores), after ``WORKBENCH_GEMM_CUDA_PATH``."""
    want = os.environ.get(PATH_ENV, "auto").strip().lower() or "auto"
    if want not in _PATHS:
        raise BackendUnavailableError(f"{PATH_ENV} must be one of {list(_PATHS)}, got {want!r}", key="backend",
                                      fix=f"unset {PATH_ENV} or set it to auto, scalar or mma")
    dt = canonical(dtype)
    if want == "mma" and dt == "fp32":
        raise BackendUnavailableError(f"{PATH_ENV}=mma needs bf16 or fp16 inputs, got fp32", key="backend",
                                      fix=f"unset {PATH_ENV} (fp32 inputs run on CUDA cores) or pass bf16/fp16")
    if want == "auto":
        return "scalar" if dt == "fp32" else "mma"
    return want


def is_available() -> tuple[bool, str]:
    return _native.availability()


@lru_cache(maxsize=None)
def _lib(kind: str) -> ctypes.CDLL:
    if kind == "cpu":
        lib = _native.load("gemm", ["gemm/gemm_cpu.cpp"], kind="cpu", headers=_HDR)
        lib.splitk_partials_cpu.restype = None
        lib.splitk_reduce_cpu.restype = None
    else:
        lib = _native.load("gemm", ["gemm/gemm_cuda.cu"], kind="cuda", headers=_HDR)
        lib.splitk_matmul_cuda.restype = ctypes.c_int
    return lib


def _p(t):
    return ctypes.c_void_p(t.data_ptr())


def _launch(x, w, splits, partial_dtype, order):
    M, K = x.shape
    N = w.shape[0]
    if splits > 64:
        raise BackendUnavailableError(f"gemm ext supports at most 64 splits, got {splits}", key="backend",
                                      fix="use backend='torch' for more splits")
    # the CUDA kernel reads 16-byte vectors: give it fresh (aligned) storage for offset views
    x, w = (t.contiguous() for t in (x, w))
    x, w = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (x, w))
    dt, pdt, od = _DT[canonical(x.dtype)], _DT[partial_dtype], 0 if order == "sequential" else 1
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    if x.is_cuda:
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        path = _PATHS[cuda_path(x.dtype)]
        # one slice: the kernel writes the (rounded) partial straight into y
        parts = torch.empty(splits if splits > 1 else 0, min(M, 16), N, dtype=torch.float32, device=x.device)
        for m0 in range(0, M, 16):
            xm = x[m0:m0 + 16].clone()
            ym = y[m0:m0 + 16]
            rc = _lib("cuda").splitk_matmul_cuda(_p(xm), _p(w), *map(ctypes.c_int, (xm.shape[0], N, K, splits, dt, pdt, od, path)),
                                                 _p(parts), _p(ym), stream)
            if rc:
                raise BackendUnavailableError(f"split-K CUDA launch failed with code {rc}", key="backend",
                                              fix="use backend='torch'")
    else:
        parts = torch.empty(splits, M, N, dtype=torch.float32)
        lib = _lib("cpu")
        lib.splitk_partials_cpu(_p(x), _p(w), *map(ctypes.c_int, (M, N, K, splits, dt, pdt)), _p(parts))
        lib.splitk_reduce_cpu(_p(parts), ctypes.c_int(M * N), ctypes.c_int(splits), ctypes.c_int(od), _p(y))
    return y


def splitk_matmul(x, w, *, splits=None, partial_dtype=None, order=None, out_dtype=None, policy=None):
    return _launch(x, w, splits, partial_dtype, order).to(torch_dtype(out_dtype))
