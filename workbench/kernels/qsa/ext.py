"""QSA split-KV decode in native code (kernels/qsa): C++ on CPU tensors, CUDA on GPU tensors.

Layers: the kernels (``qsa_fast_kernel``/``qsa_split_kernel``/``qsa_merge_kernel`` in
``qsa_cuda.cu``, the loops of ``qsa_cpu.cpp``, both on the element code of ``qsa_elem.h``) ->
``_launch`` (pointers, grid, outputs) -> the public :func:`workbench.kernels.qsa.sparse_decode`.
Knobs: ``prob_dtype`` (fp32/fp16/bf16), ``page_order``, ``num_kv_splits``/``partition_size``,
``input_dtype`` and ``output_dtype`` (applied around the kernel); ``accum_dtype`` must be fp32.

On the GPU the fast kernel serves head dims 64/128/256 with up to 16 query heads per KV head
(fp32, bf16 or fp16 inputs) when its shared memory fits; every other shape runs the generic
kernel. :func:`cuda_launch` forces either kernel or the fast kernel's block size (tests and
benchmarks). A launch allocates its outputs through torch on the current stream and does not
synchronize, so it can be captured in a CUDA graph.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
from functools import lru_cache

import torch

from workbench.errors import BackendUnavailableError, KernelArgumentError
from workbench.kernels import _abi, _native
from workbench.kernels._abi import QsaDecodeArgs, QsaMergeArgs
from workbench.kernels.qsa._compiled import decode_with_io_policy
from workbench.kernels.qsa.paged import visit_slots
from workbench.kernels.qsa.torch_ref import split_layout
from workbench.numerics.dtypes import NATIVE_CODES, canonical
from workbench.kernels.registry import backend_op

OPS = ("sparse_decode", "merge_states")
# the policy values it honours (the dispatcher refuses others): fp32 accumulators, probabilities
# rounded to fp32/fp16/bf16; the other decode knobs any value
KNOBS = {"input_dtype": None, "output_dtype": None, "accum_dtype": ("fp32",), "prob_dtype": ("fp32", "fp16", "bf16"),
         "partition_size": None, "num_kv_splits": None, "page_order": None}

__all__ = ["sparse_decode", "merge_states", "is_available", "cuda_launch"]

_DT = NATIVE_CODES
_KERNELS = {None: 0, "fast": 1, "generic": 2}
_launch_config = {"warps": 0, "kernel": 0}
_HDR = ["qsa/qsa_elem.h", "qsa/qsa_abi.h", "common/wb_elem.h", "common/wb_abi.h"]
LOG2E = 1.0 / math.log(2.0)


def is_available() -> tuple[bool, str]:
    return _native.availability()


@lru_cache(maxsize=None)
def _lib(kind: str) -> ctypes.CDLL:
    if kind == "cpu":
        lib = _native.load("qsa", ["qsa/qsa_cpu.cpp"], kind="cpu", headers=_HDR)
        _abi.bind(lib, {"qsa_split_partials_cpu": QsaDecodeArgs, "qsa_merge_cpu": QsaMergeArgs})
        lib.wb_round_array_cpu.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
        lib.wb_round_array_cpu.restype = None
    else:
        lib = _native.load("qsa", ["qsa/qsa_cuda.cu"], kind="cuda", headers=_HDR)
        _abi.bind(lib, {"qsa_decode_cuda": QsaDecodeArgs, "qsa_merge_cuda": QsaMergeArgs})
    _abi.check_layout(lib, QsaDecodeArgs)
    _abi.check_layout(lib, QsaMergeArgs)
    return lib


def round_elements(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """The native element rounding (``wb_round_to`` of ``kernels/common/wb_elem.h``, shared by the
    QSA and GEMM kernels) applied to fp32 CPU values: ``dtype`` "bf16" or "fp16", to nearest even,
    returned as fp32. For tests of the native rounding against an independent implementation."""
    codes = NATIVE_CODES
    if dtype not in codes:
        raise KernelArgumentError(f"dtype must be one of {sorted(codes)}, got {dtype!r}", key="dtype",
                                  fix="pass 'bf16' or 'fp16'")
    xs = x.detach().to("cpu", torch.float32).contiguous()
    y = torch.empty_like(xs)
    _lib("cpu").wb_round_array_cpu(ctypes.c_void_p(xs.data_ptr()), ctypes.c_int64(xs.numel()),
                                   ctypes.c_int(codes[dtype]), ctypes.c_void_p(y.data_ptr()))
    return y


@contextlib.contextmanager
def cuda_launch(*, warps: int | None = None, kernel: str | None = None):
    """Override the CUDA launch inside the block (for tests and benchmarks; results stay correct).

    Parameters
    ----------
    warps: warps per block of the fast kernel, 1..8 (None: 8 while the grid has fewer blocks than
        twice the multiprocessors, else 4)
    kernel: ``"fast"`` (fails with WB_ERR_SHAPE on shapes it does not serve), ``"generic"`` or None
        (the fast kernel wherever it applies)

    Example
    -------
    >>> with cuda_launch(kernel="generic"):
    ...     o, lse = sparse_decode(q, cache, cache.block_table, idx, num_splits=8)  # doctest: +SKIP
    """
    if warps is not None and (not isinstance(warps, int) or isinstance(warps, bool) or not 1 <= warps <= 8):
        raise KernelArgumentError(f"warps must be an int in 1..8 or None, got {warps!r}", key="warps",
                                  fix="pass warps=4 or warps=8, or None for the automatic choice")
    if kernel not in _KERNELS:
        raise KernelArgumentError(f"kernel must be one of ['fast', 'generic', None], got {kernel!r}", key="kernel",
                                  fix="pass kernel='fast', 'generic' or None")
    saved = dict(_launch_config)
    _launch_config.update(warps=warps or 0, kernel=_KERNELS[kernel])
    try:
        yield
    finally:
        _launch_config.update(saved)


def _int32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def _launch(q, k, v, block_table, indices, scale, num_splits, policy):
    B, HQ, D = q.shape
    _, ps, HKV, _ = k.shape
    dt = canonical(q.dtype)
    if dt not in _DT:
        raise BackendUnavailableError(f"qsa ext reads fp32/bf16/fp16, got {dt}", key="backend",
                                      fix="materialize q/k/v in bf16 or use backend='torch'")
    if policy.page_order == "physical":
        idx, mode = _int32(visit_slots(block_table, indices, ps, "physical")), 1
    else:
        idx, mode = _int32(indices), 0
    bt = _int32(block_table)
    L = idx.shape[1]
    S, P = split_layout(L, policy.num_kv_splits if num_splits is None else num_splits, policy)
    qscale = float((D ** -0.5 if scale is None else scale) * LOG2E)
    # two allocations: the outputs [o | lse] and the split partials [o_parts | lse_parts]
    rows = B * HQ
    out = torch.empty(rows * (D + 1), dtype=torch.float32, device=q.device)
    parts = torch.empty(rows * S * (D + 1), dtype=torch.float32, device=q.device)
    o, lse = out[: rows * D].view(B, HQ, D), out[rows * D:].view(B, HQ)
    o_parts = parts.data_ptr()
    lse_parts = o_parts + rows * S * D * 4
    # the CUDA kernels read 16-byte vectors of q, k and v: offset views get fresh (aligned) storage
    q, k, v = (t.contiguous() for t in (q, k, v))
    q, k, v = (t if t.data_ptr() % 16 == 0 else t.clone() for t in (q, k, v))
    a = QsaDecodeArgs.of(q=q, k=k, v=v, idx=idx, bt=bt, o_parts=o_parts, lse_parts=lse_parts, o=o, lse=lse,
                         mode=mode, B=B, HQ=HQ, HKV=HKV, D=D, ps=ps, max_pages=bt.shape[1], L=L, S=S, P=P,
                         qscale=qscale, dt=_DT[dt], prob_dt=_DT[policy.prob_dtype])
    if q.is_cuda:
        lib = _lib("cuda")
        a.stream, a.warps, a.kernel = (torch.cuda.current_stream().cuda_stream, _launch_config["warps"],
                                       _launch_config["kernel"])
        rc = lib.qsa_decode_cuda(ctypes.byref(a))
        if rc != _abi.WB_OK:
            raise _abi.status_error(lib, rc, "qsa CUDA launch",
                                    fix="WB_ERR_SHAPE: more than 16 query heads per KV head, D not a multiple of 8, or "
                                        "kernel='fast' forced on a shape it does not serve; WB_ERR_SHARED_MEM: use "
                                        "more num_splits (smaller partitions); else backend='torch'")
    else:
        lib = _lib("cpu")
        m = QsaMergeArgs.of(o_parts=o_parts, lse_parts=lse_parts, o=o, lse=lse, rows=B * HQ, S=S, D=D)
        for rc in (lib.qsa_split_partials_cpu(ctypes.byref(a)), lib.qsa_merge_cpu(ctypes.byref(m))):
            if rc != _abi.WB_OK:
                raise _abi.status_error(lib, rc, "qsa CPU build")
    return o, lse


@backend_op
def sparse_decode(q, kv_cache, block_table, indices, *, scale=None, num_splits=None, policy=None):
    return decode_with_io_policy(_launch, q, kv_cache, block_table, indices, scale, num_splits, policy)


def merge_states(o_parts, lse_parts, *, policy=None):
    *lead, S, D = o_parts.shape
    rows = math.prod(lead)
    op = o_parts.float().contiguous()
    lp = lse_parts.float().contiguous()
    o = torch.empty(*lead, D, dtype=torch.float32, device=op.device)
    lse = torch.empty(*lead, dtype=torch.float32, device=op.device)
    m = QsaMergeArgs.of(o_parts=op, lse_parts=lp, o=o, lse=lse, rows=rows, S=S, D=D)
    lib = _lib("cuda" if op.is_cuda else "cpu")
    if op.is_cuda:
        m.stream = torch.cuda.current_stream().cuda_stream
    rc = (lib.qsa_merge_cuda if op.is_cuda else lib.qsa_merge_cpu)(ctypes.byref(m))
    if rc != _abi.WB_OK:
        raise _abi.status_error(lib, rc, "qsa merge")
    return o, lse
