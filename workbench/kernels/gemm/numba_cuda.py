"""Split-K GEMM as numba.cuda kernels for skinny x (lm_head decode), on CUDA tensors through
__cuda_array_interface__.

Layers: ``_partials_kernel`` (one warp per output column n and K slice; lanes stride the slice,
keep up to 16 row accumulators, and are combined through shared memory in lane order, so the
simulator, which has no warp shuffles, runs the same code) and ``_reduce_kernel`` (the S
partials of each element, sequential or pairwise) -> ``_launch`` (rows in chunks of 16) ->
:func:`workbench.kernels.gemm.splitk_matmul`. Partials are rounded to ``partial_dtype`` and held
in an fp32 buffer; at most 64 splits.
"""

from __future__ import annotations

import numpy as np
import torch
from numba import cuda, float32

from workbench.errors import BackendUnavailableError
from workbench.kernels._numba_elem import NATIVE_CODES as _DT, _ld, _round, _simulated, _stream, is_available
from workbench.numerics.dtypes import canonical, torch_dtype

OPS = ("splitk_matmul",)
DEVICES = ("cuda",)  # CUDA tensors (the numba simulator runs CPU tensors, tiny grids, for tests)

__all__ = ["splitk_matmul", "is_available", "SIGNATURES", "selfcheck"]

MAXM, WARPS, TPB, SHW, TREE = 16, 8, 256, 4096, 64
# the policy values it honours (the dispatcher refuses others): up to TREE slices, CUDA cores only
KNOBS = {"splitk": range(1, TREE + 1), "partial_dtype": ("fp32", "bf16", "fp16"), "reduction_order": None,
         "cuda_path": ("auto", "scalar")}


@cuda.jit
def _partials_kernel(x, w, M, N, K, S, dt, part_dt, parts):
    sh = cuda.shared.array(SHW, float32)  # [WARPS][32][MAXM]
    lane = cuda.threadIdx.x % 32
    wid = cuda.threadIdx.x // 32
    n = cuda.blockIdx.x * WARPS + wid
    s = cuda.blockIdx.y
    c = (K + S - 1) // S
    k0 = s * c
    k1 = min(K, k0 + c)
    acc = cuda.local.array(MAXM, float32)
    for m in range(MAXM):
        acc[m] = float32(0.0)
    if n < N:
        for kk in range(k0 + lane, k1, 32):
            wv = _ld(w, n * K + kk, dt)
            for m in range(M):
                acc[m] = float32(acc[m] + _ld(x, m * K + kk, dt) * wv)
    for m in range(M):
        sh[(wid * 32 + lane) * MAXM + m] = acc[m]
    cuda.syncthreads()
    if n < N and lane < M:
        a = float32(0.0)
        for j in range(32):
            a = float32(a + sh[(wid * 32 + j) * MAXM + lane])
        parts[(s * M + lane) * N + n] = _round_signed(a, part_dt)


@cuda.jit(device=True, inline=True)
def _round_signed(a, dt):
    if a < float32(0.0):
        return -_round(-a, dt)
    return _round(a, dt)


@cuda.jit
def _reduce_kernel(parts, MN, S, order, y):
    i = cuda.grid(1)
    if i >= MN:
        return
    if order == 0:
        acc = parts[i]
        for s in range(1, S):
            acc = float32(acc + parts[s * MN + i])
        y[i] = acc
        return
    buf = cuda.local.array(TREE, float32)
    for s in range(S):
        buf[s] = parts[s * MN + i]
    n = S
    while n > 1:
        h = 0
        for j in range(0, n - 1, 2):
            buf[h] = float32(buf[j] + buf[j + 1])
            h += 1
        if n % 2 == 1:
            buf[h] = buf[n - 1]
            h += 1
        n = h
    y[i] = buf[0]


def _signatures():
    from numba import types as nt
    i32 = nt.int32
    sigs = [("_partials_kernel", _partials_kernel, (io[::1], io[::1], i32, i32, i32, i32, i32, i32, nt.float32[::1]))
            for io in (nt.float32, nt.int16, nt.float16)]
    sigs.append(("_reduce_kernel", _reduce_kernel, (nt.float32[::1], i32, i32, i32, nt.float32[::1])))
    return sigs


SIGNATURES = _signatures()


def _dev(t):
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)  # read as 16-bit patterns; the kernel shifts them into fp32
    return cuda.as_cuda_array(t) if t.is_cuda else t.numpy()


def _launch(x, w, splits, partial_dtype, order):
    M, K = x.shape
    N = w.shape[0]
    if not (x.is_cuda or _simulated()):
        raise BackendUnavailableError("gemm numba runs on CUDA tensors", key="backend", fix="move x and w with .cuda()")
    y = torch.empty(M, N, dtype=torch.float32, device=x.device)
    parts = torch.empty(splits * min(M, MAXM) * N, dtype=torch.float32, device=x.device)
    st = _stream()
    wd = _dev(w)
    for m0 in range(0, M, MAXM):
        xm = x[m0:m0 + MAXM]
        mm = xm.shape[0]
        pm = parts[: splits * mm * N]
        _partials_kernel[((N + WARPS - 1) // WARPS, splits), TPB, st](
            _dev(xm), wd, *map(np.int32, (mm, N, K, splits, _DT[canonical(x.dtype)], _DT[partial_dtype])), _dev(pm))
        ym = torch.empty(mm * N, dtype=torch.float32, device=x.device)
        _reduce_kernel[(mm * N + 255) // 256, 256, st](_dev(pm), np.int32(mm * N), np.int32(splits),
                                                       np.int32(0 if order == "sequential" else 1), _dev(ym))
        y[m0:m0 + mm] = ym.reshape(mm, N)
    return y


def splitk_matmul(x, w, *, splits=None, partial_dtype=None, order=None, out_dtype=None, policy=None):
    return _launch(x, w, splits, partial_dtype, order).to(torch_dtype(out_dtype))


def selfcheck(M=3, N=10, K=70, splits=3, partial_dtype="bf16", order="tree", dtype="bf16") -> dict:
    """Tiny split-K run against the fp64 oracle with partial rounding emulated (simulator tests)."""
    from workbench.kernels.gemm import oracle
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, K, generator=g).to(torch_dtype(dtype))
    w = torch.randn(N, K, generator=g).to(torch_dtype(dtype))
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    y = splitk_matmul(x.to(dev), w.to(dev), splits=splits, partial_dtype=partial_dtype, order=order,
                      out_dtype="fp32").cpu()
    ref = oracle.splitk_matmul(x, w, splits=splits, partial_dtype=partial_dtype)
    exact = oracle.splitk_matmul(x, w, splits=splits)
    return {"rel_emulated": float((y.double() - ref).norm() / ref.norm()),
            "rel_exact": float((y.double() - exact).norm() / exact.norm())}
