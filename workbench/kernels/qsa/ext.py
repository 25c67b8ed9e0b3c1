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
from workbench.kernels import _native
from workbench.kernels.qsa._compiled import decode_with_io_policy
from workbench.kernels.qsa.paged import visit_slots
from workbench.kernels.qsa.torch_ref import split_layout
from workbench.numerics.dtypes import canonical
from workbench.numerics.policy import resolve_policy

OPS = ("sparse_decode", "merge_states")
# the policy values it honours (the dispatcher refuses others): fp32 accumulators, probabilities
# rounded to fp32/fp16/bf16; the other decode knobs any value
KNOBS = {"input_dtype": None, "output_dtype": None, "accum_dtype": ("fp32",), "prob_dtype": ("fp32", "fp16", "bf16"),
         "partition_size": None, "num_kv_splits": None, "page_order": None}

__all__ = ["sparse_decode", "merge_states", "is_available", "cuda_launch"]

_DT = {"fp32": 0, "bf16": 1, "fp16": 2}
_KERNELS = {None: 0, "fast": 1, "generic": 2}
_launch_config = {"warps": 0, "kernel": 0}
_HDR = ["qsa/qsa_elem.h"]
LOG2E = 1.0 / math.log(2.0)


def is_available() -> tuple[bool, str]:
    return _native.availability()


@lru_cache(maxsize=None)
def _lib(kind: str) -> ctypes.CDLL:
    if kind == "cpu":
        lib = _native.load("qsa", ["qsa/qsa_cpu.cpp"], kind="cpu", headers=_HDR)
        lib.qsa_split_partials_cpu.restype = None
        lib.qsa_merge_cpu.restype = None
        lib.wb_round_array_cpu.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p]
        lib.wb_round_array_cpu.restype = None
    else:
        lib = _native.load("qsa", ["qsa/qsa_cuda.cu"], kind="cuda", headers=_HDR)
        vp, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        lib.qsa_decode_cuda_ex.argtypes = [vp] * 5 + [i32] * 10 + [f32, i32, i32] + [vp] * 5 + [i32, i32]
        lib.qsa_decode_cuda_ex.restype = ctypes.c_int
        lib.qsa_decode_cuda.restype = ctypes.c_int
        lib.qsa_merge_cuda.restype = ctypes.c_int
    return lib


def round_elements(x: torch.Tensor, dtype: str) -> torch.Tensor:
    """The native element rounding (``wb_round_to`` of ``kernels/qsa/qsa_elem.h``, shared by the
    QSA and GEMM kernels) applied to fp32 CPU values: ``dtype`` "bf16" or "fp16", to nearest even,
    returned as fp32. For tests of the native rounding against an independent implementation."""
    codes = {"fp32": 0, "bf16": 1, "fp16": 2}
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
    kernel: ``"fast"`` (fails with code 2 on shapes it does not serve), ``"generic"`` or None
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


def _p(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def _int32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def _stream():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


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
    if q.is_cuda:
        rc = _lib("cuda").qsa_decode_cuda_ex(
            q.data_ptr(), k.data_ptr(), v.data_ptr(), idx.data_ptr(), bt.data_ptr(), mode, B, HQ, HKV, D, ps,
            bt.shape[1], L, S, P, qscale, _DT[dt], _DT[policy.prob_dtype], o_parts, lse_parts,
            o.data_ptr(), lse.data_ptr(), torch.cuda.current_stream().cuda_stream,
            _launch_config["warps"], _launch_config["kernel"])
        if rc:
            raise BackendUnavailableError(f"qsa CUDA launch failed with code {rc} (2: more than 16 query heads per KV head, "
                                          "D not a multiple of 8, or kernel='fast' forced on a shape it does not serve; "
                                          "3: shared memory too large for the partition; other: a CUDA error)",
                                          key="backend", fix="use more num_splits (smaller partitions) or backend='torch'")
    else:
        ints = [ctypes.c_int(x) for x in (mode, B, HQ, HKV, D, ps, bt.shape[1], L, S, P)]
        tail = [ctypes.c_float(qscale), ctypes.c_int(_DT[dt]), ctypes.c_int(_DT[policy.prob_dtype])]
        lib = _lib("cpu")
        op, lp = ctypes.c_void_p(o_parts), ctypes.c_void_p(lse_parts)
        lib.qsa_split_partials_cpu(_p(q), _p(k), _p(v), _p(idx), _p(bt), *ints, *tail, op, lp)
        lib.qsa_merge_cpu(op, lp, ctypes.c_int(B * HQ), ctypes.c_int(S), ctypes.c_int(D), _p(o), _p(lse))
    return o, lse


def sparse_decode(q, kv_cache, block_table, indices, *, scale=None, num_splits=None, policy=None):
    policy = resolve_policy(policy)
    return decode_with_io_policy(_launch, q, kv_cache, block_table, indices, scale, num_splits, policy)


def merge_states(o_parts, lse_parts, *, policy=None):
    *lead, S, D = o_parts.shape
    rows = math.prod(lead)
    op = o_parts.float().contiguous()
    lp = lse_parts.float().contiguous()
    o = torch.empty(*lead, D, dtype=torch.float32, device=op.device)
    lse = torch.empty(*lead, dtype=torch.float32, device=op.device)
    args = (_p(op), _p(lp), ctypes.c_int(rows), ctypes.c_int(S), ctypes.c_int(D), _p(o), _p(lse))
    if op.is_cuda:
        _lib("cuda").qsa_merge_cuda(*args, _stream())
    else:
        _lib("cpu").qsa_merge_cpu(*args)
    return o, lse
