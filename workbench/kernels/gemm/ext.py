"""Split-K GEMM in native code (kernels/gemm): C++ on CPU tensors, CUDA on GPU tensors.

Layers: ``splitk_partials_kernel``/``splitk_reduce_kernel`` (``gemm_cuda.cu``) or the loops of
``gemm_cpu.cpp`` -> ``_launch`` -> :func:`workbench.kernels.gemm.splitk_matmul`. Partials are
rounded to ``partial_dtype`` and held in an fp32 buffer (the values a ``partial_dtype`` store
would hold); at most 64 splits; the CUDA kernel takes M in chunks of 16 rows.

On GPU tensors the CUDA build has two partial kernels (``gemm_cuda.cu``): ``splitk_mma_kernel``
(tensor cores, mma.sync m16n8k16 with fp32 results) and ``splitk_partials_kernel`` (CUDA cores,
plain fp32 multiply and add). The path is chosen automatically: tensor cores for bf16/fp16
inputs, CUDA cores for fp32 inputs. The policy knob ``cuda_path`` chooses: ``auto`` (default),
``scalar`` (CUDA cores for every dtype) or ``mma`` (tensor cores; refused for fp32 inputs); the
environment variable ``WORKBENCH_GEMM_CUDA_PATH`` (read at every call) replaces its default
``auto`` only. The path taken is noted with the call (``workbench.kernels.registry.kernel_log``). Both keep the split-K contract: slices of
``ceil(K / splits)`` columns, each summed in fp32, rounded once to ``partial_dtype``, the partials
reduced in ``order``. On the tensor-core path the order of accumulation inside a slice is the
hardware's (16-product blocks, see docs/kernels/gemm.md), not the CPU build's k-ascending loop.
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from workbench.errors import PolicyError
from workbench.kernels import _abi, _native
from workbench.kernels._abi import SplitkArgs
from workbench.kernels.registry import backend_op, note_path
from workbench.numerics.dtypes import canonical, native_code, torch_dtype
from workbench.numerics.policy import requested_cuda_path

OPS = ("splitk_matmul",)
# the policy values it honours (the dispatcher refuses others): up to 64 slices, fp32/bf16/fp16 partials
KNOBS = {"splitk": range(1, 65), "partial_dtype": ("fp32", "bf16", "fp16"), "reduction_order": None,
         "cuda_path": ("auto", "scalar", "mma")}

__all__ = ["splitk_matmul", "is_available", "cuda_path", "PATH_ENV"]

_HDR = ["gemm/gemm_elem.h", "gemm/gemm_abi.h", "common/wb_elem.h", "common/wb_abi.h", "common/mma_ops.h"]
PATH_ENV = "WORKBENCH_GEMM_CUDA_PATH"
_PATHS = {"auto": 0, "scalar": 1, "mma": 2}


def cuda_path(dtype, policy_path: str = "auto") -> str:
    """The CUDA partial kernel a GPU call with inputs of ``dtype`` uses: ``"mma"`` (tensor cores)
    or ``"scalar"`` (CUDA cores), from the policy's ``cuda_path`` (whose default ``auto``
    ``WORKBENCH_GEMM_CUDA_PATH`` may replace)."""
    want, source = requested_cuda_path(policy_path, PATH_ENV)
    dt = canonical(dtype)
    if want == "mma" and dt == "fp32":
        raise PolicyError(f"{source}: the tensor-core path needs bf16 or fp16 inputs, got fp32", key="cuda_path",
                          fix="use cuda_path='auto' (fp32 inputs run on CUDA cores) or pass bf16/fp16")
    if want == "auto":
        return "scalar" if dt == "fp32" else "mma"
    return want


def is_available() -> tuple[bool, str]:
    return _native.availability()


@lru_cache(maxsize=None)
def _lib(kind: str) -> ctypes.CDLL:
    if kind == "cpu":
        lib = _native.load("gemm", ["gemm/gemm_cpu.cpp"], kind="cpu", headers=_HDR)
        _abi.bind(lib, {"splitk_partials_cpu": SplitkArgs, "splitk_reduce_cpu": SplitkArgs})
    else:
        lib = _native.load("gemm", ["gemm/gemm_cuda.cu"], kind="cuda", headers=_HDR)
        _abi.bind(lib, {"splitk_matmul_cuda": SplitkArgs})
    _abi.check_layout(lib, SplitkArgs)
    return lib


def _launch(x, w, splits, partial_dtype, order, policy_path="auto"):
    M, K = x.shape
    N = w.shape[0]
    # the CUDA kernel reads 16-byte vectors: give it fresh (aligned) storage for offset views
    x, w = (t.contiguous() for t in (x, w))
    x, w = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (x, w))
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    a = SplitkArgs.of(w=w, M=M, N=N, K=K, S=splits, dt=native_code(x.dtype), part_dt=native_code(partial_dtype),
                      order=0 if order == "sequential" else 1)
    if x.is_cuda:
        a.stream = torch.cuda.current_stream().cuda_stream
        chosen = cuda_path(x.dtype, policy_path)
        note_path(chosen)
        a.path = _PATHS[chosen]
        # one slice: the kernel writes the (rounded) partial straight into y
        parts = torch.empty(splits if splits > 1 else 0, min(M, 16), N, dtype=torch.float32, device=x.device)
        lib = _lib("cuda")
        for m0 in range(0, M, 16):
            xm = x[m0:m0 + 16].clone()
            ym = y[m0:m0 + 16]
            a.x, a.M, a.parts, a.y = xm.data_ptr(), xm.shape[0], parts.data_ptr(), ym.data_ptr()
            rc = lib.splitk_matmul_cuda(ctypes.byref(a))
            if rc != _abi.WB_OK:
                raise _abi.status_error(lib, rc, "split-K CUDA launch")
    else:
        if policy_path == "mma":
            raise PolicyError("policy.cuda_path='mma': the tensor-core path is the CUDA build's; these are CPU "
                              "tensors", key="cuda_path", fix="use cuda_path='auto' or 'scalar'")
        note_path("cpu")
        parts = torch.empty(splits, M, N, dtype=torch.float32)
        lib = _lib("cpu")
        a.x, a.parts, a.y = x.data_ptr(), parts.data_ptr(), y.data_ptr()
        for entry in (lib.splitk_partials_cpu, lib.splitk_reduce_cpu):
            rc = entry(ctypes.byref(a))
            if rc != _abi.WB_OK:
                raise _abi.status_error(lib, rc, "split-K CPU build")
    return y


@backend_op
def splitk_matmul(x, w, *, splits=None, partial_dtype=None, order=None, out_dtype=None, policy=None):
    return _launch(x, w, splits, partial_dtype, order, policy.cuda_path).to(torch_dtype(out_dtype))
