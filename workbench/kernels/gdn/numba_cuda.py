"""GDN as numba.cuda kernels: a batched decode kernel, a prefill recurrence and a chunked prefill.

Kernels (each built by a factory whose arguments become compile-time constants, so loops over
the K rows unroll and the state lives in registers):

- ``decode`` (T = 1): a block of NS warps-worth of threads owns BV value columns of one (b, hv);
  thread (slice w, lane) keeps K / NS state rows of its column in registers, reading q and k
  straight from global memory; partial dot products meet in shared memory;
- ``recurrent`` (prefill): the same mapping looping over T inside the kernel, with q_t and k_t
  staged in shared memory each step and the state kept in registers throughout;
- ``chunked`` (prefill), the UT/WY form in three launches: ``prepare`` (one block per chunk, all
  chunks in parallel) builds A = strictly-lower(beta K K^T * decay) in shared memory and solves
  (I + A) [W U] = [beta exp(gc) K, beta V] by forward substitution; ``state_pass`` (one block per
  (b, hv, 16 value columns), sequential over chunks, state tile in shared memory) turns U into the
  chunk's delta-rule values U - W S, writes the inter-chunk part of o and the next state;
  ``output`` (one block per chunk) adds the intra-chunk part tril(q k^T * decay) U.

Kernels compute in float32 (inputs are staged to float32 by the launcher; ``policy.accum_dtype``
"fp64" and ``state_dtype`` other than fp32 are refused). They run on CUDA tensors on torch's
current stream; under ``NUMBA_ENABLE_CUDASIM=1`` they also run, slowly, on CPU tensors in numba's
CUDA simulator (tiny shapes only). The helper ops run through the ``torch`` backend.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

from workbench.errors import KernelArgumentError
# the helper ops run through the torch implementation (same keyword signatures)
from workbench.kernels.gdn._launch import stage
from workbench.kernels.registry import backend_op, note_path
from workbench.kernels.gdn._varlen import per_sequence

try:  # kernels must see the module-level ``cuda``: the simulator swaps it in their globals
    from numba import cuda, float32
except Exception as _e:  # pragma: no cover - is_available() reports it
    cuda = float32 = None
    _IMPORT_ERROR = f"{type(_e).__name__}: {_e}"

# the ops this backend implements itself; the helper ops (gates, conv, gated norm) are torch's
# or the oracle's, reached through fallback= (workbench.kernels.registry.get_op)
OPS = ("recurrent", "chunked")
DEVICES = ("cuda",)  # CUDA tensors (the numba simulator runs CPU tensors, tiny grids, for tests)

__all__ = ["recurrent", "chunked", "is_available",
           "kernel_sources"]

NS = 4                 # K slices per value column in the recurrent kernels
MAX_CHUNK = 64
# the policy values it honours (the dispatcher refuses others): float32 state and accumulators,
# chunks up to MAX_CHUNK, CUDA cores only
KNOBS = {"input_dtype": None, "output_dtype": None, "accum_dtype": ("fp32",), "state_dtype": ("fp32",),
         "chunk_size": range(1, MAX_CHUNK + 1), "cuda_path": ("auto", "scalar")}
SMEM_LIMIT = 48 * 1024  # numba's static shared memory per block


def _simulator() -> bool:
    from numba import config
    return bool(config.ENABLE_CUDASIM)


def is_available() -> tuple[bool, str]:
    if cuda is None:
        return False, f"numba.cuda does not import ({_IMPORT_ERROR}); pip install numba-cuda"
    if _simulator():
        return True, "numba CUDA simulator (NUMBA_ENABLE_CUDASIM=1): CPU tensors, tiny shapes only"
    try:
        ok = cuda.is_available()
    except Exception:  # pragma: no cover - driver problems
        ok = False
    if not ok:
        return False, ("no CUDA GPU visible to numba (numba.cuda.is_available() is False); run on "
                       "a GPU machine, or set NUMBA_ENABLE_CUDASIM=1 for the CUDA simulator")
    if not torch.cuda.is_available():
        return False, "torch has no CUDA support here, so it cannot hand CUDA tensors to numba"
    return True, f"numba.cuda on {torch.cuda.get_device_name()}"


# ---------------------------------------------------------------- kernels (python functions)

def _signature():
    from numba import types
    a4, a3 = types.float32[:, :, :, ::1], types.float32[:, :, ::1]
    i32 = types.int32
    return types.void(a4, a4, a4, a3, a3, a4, a4, i32, i32, i32, i32, types.float32)


def _decode_src(K: int, BV: int):
    RK = K // NS

    def gdn_decode(q, k, v, g, beta, o, state, T, H, HV, V, scale):
        red = cuda.shared.array((NS, BV), float32)
        s = cuda.local.array(RK, float32)
        b = cuda.blockIdx.x // HV
        hv = cuda.blockIdx.x % HV
        h = hv // (HV // H)
        lane = cuda.threadIdx.x % BV
        w = cuda.threadIdx.x // BV
        c = cuda.blockIdx.y * BV + lane
        active = c < V
        decay = math.exp(g[b, 0, hv])
        bt = beta[b, 0, hv]
        for i in range(RK):  # all state loads first, so they are in flight together
            s[i] = state[b, hv, w * RK + i, c] if active else float32(0.0)
        p = float32(0.0)
        for i in range(RK):
            p += s[i] * k[b, 0, h, w * RK + i]
        red[w, lane] = p
        cuda.syncthreads()
        kv = float32(0.0)
        for j in range(NS):
            kv += red[j, lane]
        vi = v[b, 0, hv, c] if active else float32(0.0)
        u = bt * (vi - decay * kv)
        po = float32(0.0)
        for i in range(RK):
            r = w * RK + i
            sn = decay * s[i] + k[b, 0, h, r] * u
            po += sn * q[b, 0, h, r]
            if active:
                state[b, hv, r, c] = sn
        cuda.syncthreads()
        red[w, lane] = po
        cuda.syncthreads()
        if w == 0 and active:
            acc = float32(0.0)
            for j in range(NS):
                acc += red[j, lane]
            o[b, 0, hv, c] = scale * acc

    return gdn_decode


def _recurrent_src(K: int, BV: int):
    RK = K // NS
    NT = NS * BV

    def gdn_recurrent(q, k, v, g, beta, o, state, T, H, HV, V, scale):
        red = cuda.shared.array((NS, BV), float32)
        ks = cuda.shared.array(K, float32)
        qs = cuda.shared.array(K, float32)
        s = cuda.local.array(RK, float32)
        b = cuda.blockIdx.x // HV
        hv = cuda.blockIdx.x % HV
        h = hv // (HV // H)
        tid = cuda.threadIdx.x
        lane = tid % BV
        w = tid // BV
        c = cuda.blockIdx.y * BV + lane
        active = c < V
        for i in range(RK):
            s[i] = state[b, hv, w * RK + i, c] if active else float32(0.0)
        for t in range(T):
            for i in range(tid, K, NT):
                ks[i] = k[b, t, h, i]
                qs[i] = q[b, t, h, i]
            decay = math.exp(g[b, t, hv])
            bt = beta[b, t, hv]
            vi = v[b, t, hv, c] if active else float32(0.0)
            cuda.syncthreads()
            p = float32(0.0)
            for i in range(RK):
                p += s[i] * ks[w * RK + i]
            red[w, lane] = p
            cuda.syncthreads()
            kv = float32(0.0)
            for j in range(NS):
                kv += red[j, lane]
            u = bt * (vi - decay * kv)
            po = float32(0.0)
            for i in range(RK):
                s[i] = decay * s[i] + ks[w * RK + i] * u
                po += s[i] * qs[w * RK + i]
            cuda.syncthreads()
            red[w, lane] = po
            cuda.syncthreads()
            if w == 0 and active:
                acc = float32(0.0)
                for j in range(NS):
                    acc += red[j, lane]
                o[b, t, hv, c] = scale * acc
        if active:
            for i in range(RK):
                state[b, hv, w * RK + i, c] = s[i]

    return gdn_recurrent


def _prepare_src(K: int, V: int, C: int, NT: int):
    """Phase 1 of the chunked form, one block per (b, hv, chunk): W = (I + A)^-1 beta exp(gc) K and
    U = (I + A)^-1 beta V by forward substitution, one right-hand-side column per thread."""

    def gdn_chunk_prepare(k, v, g, beta, gcum, W, U, T, H, HV, NC):
        A = cuda.shared.array((C, C), float32)
        gc = cuda.shared.array(C, float32)
        bt = cuda.shared.array(C, float32)
        bh = cuda.blockIdx.x // NC
        t0 = (cuda.blockIdx.x % NC) * C
        b = bh // HV
        hv = bh % HV
        h = hv // (HV // H)
        L = min(C, T - t0)
        tid = cuda.threadIdx.x
        if tid == 0:
            acc = float32(0.0)
            for i in range(L):
                acc += g[b, t0 + i, hv]
                gc[i] = acc
                gcum[b, hv, t0 + i] = acc
                bt[i] = beta[b, t0 + i, hv]
        cuda.syncthreads()
        for idx in range(tid, L * L, NT):
            i = idx // L
            j = idx % L
            if j < i:
                d = float32(0.0)
                for kk in range(K):
                    d += k[b, t0 + i, h, kk] * k[b, t0 + j, h, kk]
                A[i, j] = bt[i] * d * math.exp(gc[i] - gc[j])
        cuda.syncthreads()
        for col in range(tid, K + V, NT):
            if col < K:
                for i in range(L):
                    acc = bt[i] * math.exp(gc[i]) * k[b, t0 + i, h, col]
                    for j in range(i):
                        acc -= A[i, j] * W[b, hv, t0 + j, col]
                    W[b, hv, t0 + i, col] = acc
            else:
                c = col - K
                for i in range(L):
                    acc = bt[i] * v[b, t0 + i, hv, c]
                    for j in range(i):
                        acc -= A[i, j] * U[b, hv, t0 + j, c]
                    U[b, hv, t0 + i, c] = acc

    return gdn_chunk_prepare


def _state_pass_src(K: int, BV: int, C: int, NT: int):
    """Phase 2, one block per (b, hv, tile of BV value columns), sequential over chunks with the
    state tile in shared memory: U <- U - W S, o <- exp(gc) q S, then the next state from the
    chunk's keys (staged in shared memory when they fit) and the decayed U."""
    STAGE = 4 * (C * K + K * BV + C * BV + 2 * C) <= SMEM_LIMIT
    KS_SHAPE = (C, K) if STAGE else (1, 1)

    def gdn_chunk_state_pass(q, k, gcum, W, U, o, state, T, H, HV, V):
        S = cuda.shared.array((K, BV), float32)
        Ud = cuda.shared.array((C, BV), float32)
        dq = cuda.shared.array(C, float32)
        dk = cuda.shared.array(C, float32)
        Ks = cuda.shared.array(KS_SHAPE, float32)
        b = cuda.blockIdx.x // HV
        hv = cuda.blockIdx.x % HV
        h = hv // (HV // H)
        c0 = cuda.blockIdx.y * BV
        bv = min(BV, V - c0)
        tid = cuda.threadIdx.x
        for idx in range(tid, K * bv, NT):
            S[idx // bv, idx % bv] = state[b, hv, idx // bv, c0 + idx % bv]
        for t0 in range(0, T, C):
            L = min(C, T - t0)
            cuda.syncthreads()
            if STAGE:
                for idx in range(tid, L * K, NT):
                    Ks[idx // K, idx % K] = k[b, t0 + idx // K, h, idx % K]
            glast = gcum[b, hv, t0 + L - 1]
            for i in range(tid, L, NT):
                dq[i] = math.exp(gcum[b, hv, t0 + i])
                dk[i] = math.exp(glast - gcum[b, hv, t0 + i])
            cuda.syncthreads()
            for idx in range(tid, L * bv, NT):
                i = idx // bv
                c = idx % bv
                ws = float32(0.0)
                qs = float32(0.0)
                for kk in range(K):
                    ws += W[b, hv, t0 + i, kk] * S[kk, c]
                    qs += q[b, t0 + i, h, kk] * S[kk, c]
                un = U[b, hv, t0 + i, c0 + c] - ws
                U[b, hv, t0 + i, c0 + c] = un
                Ud[i, c] = dk[i] * un
                o[b, t0 + i, hv, c0 + c] = dq[i] * qs
            cuda.syncthreads()
            elast = dq[L - 1]
            for idx in range(tid, K * bv, NT):
                kk = idx // bv
                c = idx % bv
                acc = elast * S[kk, c]
                if STAGE:
                    for j in range(L):
                        acc += Ks[j, kk] * Ud[j, c]
                else:
                    for j in range(L):
                        acc += k[b, t0 + j, h, kk] * Ud[j, c]
                S[kk, c] = acc
        cuda.syncthreads()
        for idx in range(tid, K * bv, NT):
            state[b, hv, idx // bv, c0 + idx % bv] = S[idx // bv, idx % bv]

    return gdn_chunk_state_pass


def _output_src(K: int, V: int, C: int, NT: int):
    """Phase 3, one block per (b, hv, chunk): o <- scale (o + tril(q k^T decay) U)."""

    def gdn_chunk_output(q, k, gcum, U, o, T, H, HV, NC, scale):
        P = cuda.shared.array((C, C), float32)
        gc = cuda.shared.array(C, float32)
        bh = cuda.blockIdx.x // NC
        t0 = (cuda.blockIdx.x % NC) * C
        b = bh // HV
        hv = bh % HV
        h = hv // (HV // H)
        L = min(C, T - t0)
        tid = cuda.threadIdx.x
        for i in range(tid, L, NT):
            gc[i] = gcum[b, hv, t0 + i]
        cuda.syncthreads()
        for idx in range(tid, L * L, NT):
            i = idx // L
            j = idx % L
            if j <= i:
                d = float32(0.0)
                for kk in range(K):
                    d += q[b, t0 + i, h, kk] * k[b, t0 + j, h, kk]
                P[i, j] = d * math.exp(gc[i] - gc[j])
        cuda.syncthreads()
        for idx in range(tid, L * V, NT):
            i = idx // V
            c = idx % V
            acc = float32(0.0)
            for j in range(i + 1):
                acc += P[i, j] * U[b, hv, t0 + j, c]
            o[b, t0 + i, hv, c] = scale * (o[b, t0 + i, hv, c] + acc)

    return gdn_chunk_output


# ---------------------------------------------------------------- launch configuration

PHASE_THREADS = 256   # threads of the per-chunk phases (prepare, output)
PASS_THREADS = 128    # threads of the sequential state pass
PASS_BV = 16          # value columns per block of the state pass


def _sigs():
    from numba import types
    a4, a3 = types.float32[:, :, :, ::1], types.float32[:, :, ::1]
    i32, f32 = types.int32, types.float32
    return {
        "recurrent": _signature(),
        "prepare": types.void(a4, a4, a3, a3, a3, a4, a4, i32, i32, i32, i32),
        "state_pass": types.void(a4, a4, a3, a4, a4, a4, a4, i32, i32, i32, i32),
        "output": types.void(a4, a4, a3, a4, a4, i32, i32, i32, i32, f32),
    }


def _config(K: int, V: int, C: int) -> dict:
    """Threads and tiles per kernel; the simulator gets small blocks (a Python thread per thread)."""
    sim = _simulator()
    return dict(bv=min(32, V), phase=32 if sim else PHASE_THREADS,
                pass_threads=32 if sim else PASS_THREADS, pass_bv=min(PASS_BV, V))


def kernel_sources(K: int = 128, V: int = 128, C: int = 64) -> dict:
    """{name: (python function, signature)} of every kernel as launched for K, V and chunk C;
    the CI compiles each to PTX for sm_90."""
    sig = _sigs()
    cfg = _config(K, V, C)
    return {
        "decode": (_decode_src(K, cfg["bv"]), sig["recurrent"]),
        "recurrent": (_recurrent_src(K, cfg["bv"]), sig["recurrent"]),
        "prepare": (_prepare_src(K, V, C, cfg["phase"]), sig["prepare"]),
        "state_pass": (_state_pass_src(K, cfg["pass_bv"], C, cfg["pass_threads"]), sig["state_pass"]),
        "output": (_output_src(K, V, C, cfg["phase"]), sig["output"]),
    }


@lru_cache(maxsize=None)
def _kernel(name: str, K: int, V: int, C: int):
    fn, sig = kernel_sources(K, V, C)[name]
    return cuda.jit(sig)(fn) if not _simulator() else cuda.jit(fn)


def _go(kern, grid, block, args, device):
    if _simulator():
        # numpy views share memory with the CPU tensors, so results land in the tensors
        kern[grid, block](*[a.numpy() if isinstance(a, torch.Tensor) else a for a in args])
        return
    with torch.cuda.device(device):
        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        # no CAI stream sync: the kernel runs on the stream the tensors were produced on
        arrs = [cuda.as_cuda_array(a, sync=False) if isinstance(a, torch.Tensor) else a
                for a in args]
        kern[grid, block, stream](*arrs)


def launch(name, s, C, tensors, state, o):
    """Run ``name`` ("decode", "recurrent" or "chunked") on staged float32 tensors; ``state`` is
    updated in place."""
    if s.K % NS:
        raise KernelArgumentError(f"q: expected K divisible by {NS} for backend 'numba', got "
                                  f"K={s.K}", key="q", fix="use backend='torch' or 'ext'")
    q, k, v, g, beta = tensors
    dev = q.device
    if name in ("decode", "recurrent"):
        cfg = _config(s.K, s.V, 0)
        bv = cfg["bv"]
        grid = (s.B * s.HV, (s.V + bv - 1) // bv)
        _go(_kernel(name, s.K, s.V, 0), grid, NS * bv,
            [q, k, v, g, beta, o, state, s.T, s.H, s.HV, s.V, s.scale], dev)
        return
    cfg = _config(s.K, s.V, C)
    NC = (s.T + C - 1) // C
    f32 = dict(dtype=torch.float32, device=dev)
    gcum = torch.empty(s.B, s.HV, s.T, **f32)
    W = torch.empty(s.B, s.HV, s.T, s.K, **f32)
    U = torch.empty(s.B, s.HV, s.T, s.V, **f32)
    _go(_kernel("prepare", s.K, s.V, C), s.B * s.HV * NC, cfg["phase"],
        [k, v, g, beta, gcum, W, U, s.T, s.H, s.HV, NC], dev)
    pbv = cfg["pass_bv"]
    _go(_kernel("state_pass", s.K, s.V, C), (s.B * s.HV, (s.V + pbv - 1) // pbv),
        cfg["pass_threads"], [q, k, gcum, W, U, o, state, s.T, s.H, s.HV, s.V], dev)
    _go(_kernel("output", s.K, s.V, C), s.B * s.HV * NC, cfg["phase"],
        [q, k, gcum, U, o, s.T, s.H, s.HV, NC, s.scale], dev)


def _run(op, q, k, v, g, beta, scale, initial_state, qk_l2norm, policy, chunk_size=None):
    s, p, C, tensors, state, out = stage("numba", q, k, v, g, beta, scale, initial_state,
                                         qk_l2norm, policy, chunk_size)
    note_path("scalar")
    if not tensors[0].is_cuda and not _simulator():
        raise KernelArgumentError(
            f"q: expected CUDA tensors for backend 'numba', got device {tensors[0].device}",
            key="q", fix="move the tensors to the GPU (x.cuda()), or set NUMBA_ENABLE_CUDASIM=1 "
                         "before importing numba to use the simulator")
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=torch.float32, device=tensors[0].device)
    if s.T > 0:
        name = op if op == "chunked" else ("decode" if s.T == 1 else "recurrent")
        launch(name, s, C, tensors, state, o)
    return o.to(out), state


@backend_op
def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False, cu_seqlens=None,
              policy=None):
    if cu_seqlens is not None:  # a packed batch: each sequence alone (workbench.kernels.gdn._varlen)
        return per_sequence(recurrent, q, k, v, g, beta, cu_seqlens, initial_state, scale=scale,
                            qk_l2norm=qk_l2norm, policy=policy)
    return _run("recurrent", q, k, v, g, beta, scale, initial_state, qk_l2norm, policy)


@backend_op
def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False,
            chunk_size=None, cu_seqlens=None, policy=None):
    if cu_seqlens is not None:  # a packed batch: each sequence alone, no chunk crosses a boundary
        return per_sequence(chunked, q, k, v, g, beta, cu_seqlens, initial_state, scale=scale,
                            qk_l2norm=qk_l2norm, chunk_size=chunk_size, policy=policy)
    return _run("chunked", q, k, v, g, beta, scale, initial_state, qk_l2norm, policy, chunk_size)
