"""QSA split-KV decode as numba.cuda kernels, run on CUDA tensors through __cuda_array_interface__.

Layers: ``_split_kernel`` / ``_merge_kernel`` (same mapping as the native CUDA kernel: one block
per (b, kv head, split) serving the G query heads of that KV head; (head, token) score work
items; one thread per head-dim column for P.V; sequential sums in token order) -> ``_launch``
-> :func:`workbench.kernels.qsa.sparse_decode`. bf16 tensors are read as their 16-bit patterns.

Limits (static shared memory): ``G * (D + 1) <= 4112`` (q rows padded by one float so the
G heads of a token fall in distinct banks), partition ``P <= 1024`` and ``G * P <= 6144``
(e.g. 12 query heads per KV head: at most 512 tokens per split, num_splits >= 5 for 2051 tokens).
NVVM may contract multiply-adds into FMA, so sums can differ in the last bit from the C++ build.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from numba import cuda, float32, int32, int64

from workbench.errors import BackendUnavailableError
from workbench.kernels._numba_elem import (NATIVE_CODES as _DT, _exp2, _ld, _log2, _round, _simulated,
                                          _stream, is_available)
from workbench.kernels.qsa._compiled import decode_with_io_policy
from workbench.kernels.qsa.paged import visit_slots
from workbench.kernels.qsa.torch_ref import split_layout
from workbench.numerics.dtypes import canonical, torch_dtype
from workbench.kernels.registry import backend_op

OPS = ("sparse_decode", "merge_states")
DEVICES = ("cuda",)  # CUDA tensors (the numba simulator runs CPU tensors, tiny grids, for tests)
# the policy values it honours (the dispatcher refuses others): fp32 accumulators, probabilities
# rounded to fp32/fp16/bf16; the other decode knobs any value
KNOBS = {"input_dtype": None, "output_dtype": None, "accum_dtype": ("fp32",), "prob_dtype": ("fp32", "fp16", "bf16"),
         "partition_size": None, "num_kv_splits": None, "page_order": None}

__all__ = ["sparse_decode", "merge_states", "is_available", "SIGNATURES", "selfcheck"]

MAXG, QS, SC, SL, RED = 16, 4112, 6144, 1024, 32
LOG2E = 1.0 / math.log(2.0)
NEG_INF = float32(-np.inf)


@cuda.jit
def _split_kernel(q, k, v, idx, bt, mode, HQ, HKV, D, ps, max_pages, L, S, P, qscale, dt, prob_dt, o_parts,
                  lse_parts):
    qs = cuda.shared.array(QS, float32)
    sc = cuda.shared.array(SC, float32)
    slot = cuda.shared.array(SL, int32)
    red = cuda.shared.array(RED, float32)
    G = HQ // HKV
    b = cuda.blockIdx.x // HKV
    hk = cuda.blockIdx.x % HKV
    s = cuda.blockIdx.y
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    for i in range(tid, G * D, nt):
        qs[(i // D) * (D + 1) + i % D] = _ld(q, (b * HQ + hk * G + i // D) * D + i % D, dt)
    for t in range(tid, P, nt):
        tt = s * P + t
        sl = -1
        if tt < L:
            ii = idx[b * L + tt]
            if ii >= 0:
                if mode == 1:
                    sl = ii
                else:
                    sl = bt[b * max_pages + ii // ps] * ps + ii % ps
        slot[t] = sl
    cuda.syncthreads()
    for w in range(tid, G * P, nt):
        g = w % G
        t = w // G
        acc = NEG_INF
        sl = slot[t]
        if sl >= 0:
            acc = float32(0.0)
            base = (int64(sl) * HKV + hk) * D
            for d in range(D):
                acc = float32(acc + qs[g * (D + 1) + d] * _ld(k, base + d, dt))
            acc = float32(acc * qscale)
        sc[g * P + t] = acc
    cuda.syncthreads()
    if tid < G:
        g = tid
        m = NEG_INF
        for t in range(P):
            m = max(m, sc[g * P + t])
        lsum = float32(0.0)
        for t in range(P):
            p = float32(0.0)
            if m != NEG_INF and slot[t] >= 0:
                p = _exp2(sc[g * P + t] - m)
            lsum = float32(lsum + p)
            sc[g * P + t] = _round(p, prob_dt)
        red[g] = m
        red[MAXG + g] = lsum
    cuda.syncthreads()
    acc = cuda.local.array(MAXG, float32)
    for d in range(tid, D, nt):
        for g in range(G):
            acc[g] = float32(0.0)
        for t in range(P):
            sl = slot[t]
            if sl >= 0:
                vv = _ld(v, (int64(sl) * HKV + hk) * D + d, dt)
                for g in range(G):
                    acc[g] = float32(acc[g] + sc[g * P + t] * vv)
        for g in range(G):
            lsum = red[MAXG + g]
            row = (b * HQ + hk * G + g) * S + s
            o_parts[row * D + d] = acc[g] / lsum if lsum > float32(0.0) else float32(0.0)
            if d == 0:
                lse_parts[row] = red[g] + _log2(lsum) if lsum > float32(0.0) else NEG_INF


@cuda.jit
def _merge_kernel(o_parts, lse_parts, S, D, o, lse):
    r = cuda.blockIdx.x
    for d in range(cuda.threadIdx.x, D, cuda.blockDim.x):
        m = NEG_INF
        for s in range(S):
            m = max(m, lse_parts[r * S + s])
        if m == NEG_INF:
            o[r * D + d] = float32(0.0)
            if d == 0:
                lse[r] = NEG_INF
            continue
        sw = float32(0.0)
        acc = float32(0.0)
        for s in range(S):
            w = _exp2(lse_parts[r * S + s] - m)
            sw = float32(sw + w)
            acc = float32(acc + w * o_parts[(r * S + s) * D + d])
        o[r * D + d] = acc / sw
        if d == 0:
            lse[r] = m + _log2(sw)


def _signatures():
    from numba import types as nt
    arr = lambda t: t[::1]  # noqa: E731
    i32 = nt.int32
    sigs = []
    for io in (nt.float32, nt.int16, nt.float16):
        sigs.append(("_split_kernel", _split_kernel, (arr(io), arr(io), arr(io), arr(i32), arr(i32), i32, i32, i32, i32,
                                                      i32, i32, i32, i32, i32, nt.float32, i32, i32, arr(nt.float32),
                                                      arr(nt.float32))))
    sigs.append(("_merge_kernel", _merge_kernel, (arr(nt.float32), arr(nt.float32), i32, i32, arr(nt.float32),
                                                  arr(nt.float32))))
    return sigs


SIGNATURES = _signatures()  # every kernel signature the launcher uses (PTX-compiled in CI)


def _dev(t: torch.Tensor):
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)  # read as 16-bit patterns; the kernel shifts them into fp32
    return cuda.as_cuda_array(t) if t.is_cuda else t.numpy()


def _launch(q, k, v, block_table, indices, scale, num_splits, policy, threads=256):
    B, HQ, D = q.shape
    _, ps, HKV, _ = k.shape
    G = HQ // HKV
    dt = canonical(q.dtype)
    if not (q.is_cuda or _simulated()):
        raise BackendUnavailableError("qsa numba runs on CUDA tensors", key="backend", fix="move the tensors with .cuda()")
    if policy.page_order == "physical":
        idx, mode = visit_slots(block_table, indices, ps, "physical").to(torch.int32), 1
    else:
        idx, mode = indices.to(torch.int32), 0
    L = idx.shape[1]
    S, P = split_layout(L, policy.num_kv_splits if num_splits is None else num_splits, policy)
    if G > MAXG or G * (D + 1) > QS or P > SL or G * P > SC:
        need = -(-L // max(1, min(SL, SC // G)))
        raise BackendUnavailableError(
            f"qsa numba shared-memory limits: G={G} <= {MAXG}, G*(D+1)={G * (D + 1)} <= {QS}, partition {P} <= {SL} and "
            f"G*P={G * P} <= {SC}", key="backend", fix=f"use num_splits >= {need} or backend='ext'/'torch'")
    qscale = np.float32((D ** -0.5 if scale is None else scale) * LOG2E)
    f32 = dict(dtype=torch.float32, device=q.device)
    o_parts = torch.empty(B * HQ * S * D, **f32)
    lse_parts = torch.empty(B * HQ * S, **f32)
    o = torch.empty(B * HQ * D, **f32)
    lse = torch.empty(B * HQ, **f32)
    st = _stream()
    ints = [np.int32(x) for x in (mode, HQ, HKV, D, ps, block_table.shape[1], L, S, P)]
    _split_kernel[(B * HKV, S), threads, st](_dev(q), _dev(k), _dev(v), _dev(idx), _dev(block_table.to(torch.int32)),
                                             *ints, qscale, np.int32(_DT[dt]), np.int32(_DT[policy.prob_dtype]),
                                             _dev(o_parts), _dev(lse_parts))
    _merge_kernel[B * HQ, min(256, max(32, D)), st](_dev(o_parts), _dev(lse_parts), np.int32(S), np.int32(D), _dev(o),
                                                   _dev(lse))
    return o.reshape(B, HQ, D), lse.reshape(B, HQ)


@backend_op
def sparse_decode(q, kv_cache, block_table, indices, *, scale=None, num_splits=None, policy=None):
    if canonical(q.dtype) not in _DT:
        raise BackendUnavailableError(f"qsa numba reads fp32/bf16/fp16, got {q.dtype}", key="backend",
                                      fix="use backend='torch'")
    return decode_with_io_policy(_launch, q, kv_cache, block_table, indices, scale, num_splits, policy)


def merge_states(o_parts, lse_parts, *, policy=None):
    *lead, S, D = o_parts.shape
    rows = math.prod(lead)
    o = torch.empty(rows * D, dtype=torch.float32, device=o_parts.device)
    lse = torch.empty(rows, dtype=torch.float32, device=o_parts.device)
    _merge_kernel[rows, min(256, max(32, D)), _stream()](_dev(o_parts.float()), _dev(lse_parts.float()), np.int32(S),
                                                        np.int32(D), _dev(o), _dev(lse))
    return o.reshape(*lead, D), lse.reshape(*lead)


def selfcheck(B=1, HQ=4, HKV=2, D=16, seqlen=24, budget=8, num_splits=3, prob="fp32", order="logical",
              dtype="fp32") -> dict:
    """Run this backend on a tiny problem and report its error against the FP64 oracle (used by
    the simulator tests; also a smoke test on a GPU)."""
    from workbench.kernels.qsa import oracle
    from workbench.kernels.qsa.problems import decode_problem
    from workbench.numerics import Policy
    pb = decode_problem(B=B, HQ=HQ, HKV=HKV, D=D, seqlen=seqlen, budget=budget, dtype=torch_dtype(dtype))
    if torch.cuda.is_available():
        pb = pb.to("cuda")
    pol = Policy(prob_dtype=prob, num_kv_splits=num_splits, page_order=order)
    o, lse = sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, policy=pol)
    ro, rl = oracle.sparse_decode(pb.q.cpu(), (pb.cache.k.cpu(), pb.cache.v.cpu()), pb.cache.block_table.cpu(),
                                  pb.indices.cpu())
    rel = lambda a, r: float((a.cpu().double() - r).norm() / r.norm())  # noqa: E731
    empty = pb.indices.clone()
    empty[0] = -1
    eo, el = sparse_decode(pb.q, pb.cache, pb.cache.block_table, empty, policy=pol)
    return {"o_rel": rel(o, ro), "lse_rel": rel(lse, rl), "empty_zero": bool((eo[0] == 0).all()),
            "empty_lse": float(el[0].max())}
