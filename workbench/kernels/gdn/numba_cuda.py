"""GDN as numba.cuda kernels: a batched decode kernel, a prefill recurrence and a chunked prefill.

Kernels (each built by a factory whose arguments become compile-time constants, so loops over
the K rows unroll and the state lives in registers):

- ``decode`` (T = 1): a block of NS warps-worth of threads owns BV value columns of one (b, hv);
  thread (slice w, lane) keeps K / NS state rows of its column in registers, reading q and k
  straight from global memory; partial dot products meet in shared memory;
- ``recurrent`` (prefill): the same mapping looping over T inside the kernel, with q_t and k_t
  staged in shared memory each step and the state kept in registers throughout;
- ``chunked`` (prefill): one block per (b, hv, tile of BV columns); per chunk of C steps it builds
  A = strictly-lower(beta K K^T * decay) in shared memory, solves (I + A) U = beta (V - decay K S)
  by forward substitution (the UT/WY form), then o and the next state tile, all in shared memory.

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
from workbench.kernels.gdn import torch_ref
from workbench.kernels.gdn._launch import stage

try:  # kernels must see the module-level ``cuda``: the simulator swaps it in their globals
    from numba import cuda, float32
except Exception as _e:  # pragma: no cover - is_available() reports it
    cuda = float32 = None
    _IMPORT_ERROR = f"{type(_e).__name__}: {_e}"

__all__ = ["recurrent", "chunked", "gates", "causal_conv1d", "gated_rmsnorm", "is_available",
           "kernel_sources"]

NS = 4                 # K slices per value column in the recurrent kernels
MAX_CHUNK = 64
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
    except Exception as e:  # pragma: no cover - driver problems
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


def _chunked_src(K: int, BV: int, C: int, NT: int):
    def gdn_chunked(q, k, v, g, beta, o, state, T, H, HV, V, scale):
        A = cuda.shared.array((C, C), float32)
        S = cuda.shared.array((K, BV), float32)
        R = cuda.shared.array((C, BV), float32)
        gc = cuda.shared.array(C, float32)
        bt = cuda.shared.array(C, float32)
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
            if tid == 0:
                acc = float32(0.0)
                for i in range(L):
                    acc += g[b, t0 + i, hv]
                    gc[i] = acc
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
            for idx in range(tid, L * bv, NT):
                i = idx // bv
                c = idx % bv
                ksum = float32(0.0)
                qsum = float32(0.0)
                for kk in range(K):
                    ksum += k[b, t0 + i, h, kk] * S[kk, c]
                    qsum += q[b, t0 + i, h, kk] * S[kk, c]
                decay = math.exp(gc[i])
                R[i, c] = bt[i] * (v[b, t0 + i, hv, c0 + c] - decay * ksum)
                o[b, t0 + i, hv, c0 + c] = decay * qsum  # finished below by this thread
            cuda.syncthreads()
            for i in range(1, L):
                for c in range(tid, bv, NT):
                    acc = R[i, c]
                    for j in range(i):
                        acc -= A[i, j] * R[j, c]
                    R[i, c] = acc
                cuda.syncthreads()
            for idx in range(tid, L * L, NT):
                i = idx // L
                j = idx % L
                if j <= i:
                    d = float32(0.0)
                    for kk in range(K):
                        d += q[b, t0 + i, h, kk] * k[b, t0 + j, h, kk]
                    A[i, j] = d * math.exp(gc[i] - gc[j])
            cuda.syncthreads()
            for idx in range(tid, L * bv, NT):
                i = idx // bv
                c = idx % bv
                acc = float32(0.0)
                for j in range(i + 1):
                    acc += A[i, j] * R[j, c]
                o[b, t0 + i, hv, c0 + c] = scale * (o[b, t0 + i, hv, c0 + c] + acc)
            glast = gc[L - 1]
            for idx in range(tid, K * bv, NT):
                kk = idx // bv
                c = idx % bv
                acc = math.exp(glast) * S[kk, c]
                for j in range(L):
                    acc += k[b, t0 + j, h, kk] * math.exp(glast - gc[j]) * R[j, c]
                S[kk, c] = acc
        cuda.syncthreads()
        for idx in range(tid, K * bv, NT):
            state[b, hv, idx // bv, c0 + idx % bv] = S[idx // bv, idx % bv]

    return gdn_chunked


# ---------------------------------------------------------------- launch configuration

def _tile(K: int, V: int, C: int) -> int:
    """Value columns per block: up to 32, small enough for the chunked kernel's shared memory."""
    bv = 32
    while bv > 1 and 4 * (C * C + K * bv + C * bv + 2 * C) > SMEM_LIMIT:
        bv //= 2
    return max(1, min(bv, V))


def _threads(bv: int) -> int:
    return NS * bv


def kernel_sources(K: int = 128, V: int = 128, C: int = 64) -> dict:
    """{name: (python function, signature)} of every kernel as launched for K, V and chunk C;
    the CI compiles each to PTX for sm_90."""
    sig = _signature()
    bv = _tile(K, V, C)
    return {
        "decode": (_decode_src(K, min(32, V)), sig),
        "recurrent": (_recurrent_src(K, min(32, V)), sig),
        "chunked": (_chunked_src(K, bv, C, _threads(bv)), sig),
    }


@lru_cache(maxsize=None)
def _kernel(name: str, K: int, V: int, C: int):
    fn, sig = kernel_sources(K, V, C)[name]
    return cuda.jit(sig)(fn) if not _simulator() else cuda.jit(fn)


def launch(name, s, C, tensors, state, o):
    """Run kernel ``name`` (decode, recurrent, chunked) on staged float32 tensors; ``state`` is
    updated in place."""
    if s.K % NS:
        raise KernelArgumentError(f"q: expected K divisible by {NS} for backend 'numba', got "
                                  f"K={s.K}", key="q", fix="use backend='torch' or 'ext'")
    if name == "chunked":
        bv = _tile(s.K, s.V, C)
        block = _threads(bv)
    else:
        bv = min(32, s.V)
        block = NS * bv
    grid = (s.B * s.HV, (s.V + bv - 1) // bv)
    kern = _kernel(name, s.K, s.V, C if name == "chunked" else 0)
    args = [*tensors, o, state, s.T, s.H, s.HV, s.V, s.scale]
    if _simulator():
        # numpy views share memory with the CPU tensors, so results land in o and state
        arrs = [a.numpy() if isinstance(a, torch.Tensor) else a for a in args]
        kern[grid, block](*arrs)
        return
    dev = tensors[0].device
    with torch.cuda.device(dev):
        stream = cuda.external_stream(torch.cuda.current_stream().cuda_stream)
        # no CAI stream sync: the kernel runs on the stream the tensors were produced on
        arrs = [cuda.as_cuda_array(a, sync=False) if isinstance(a, torch.Tensor) else a for a in args]
        kern[grid, block, stream](*arrs)


def _run(op, q, k, v, g, beta, scale, initial_state, qk_l2norm, policy, chunk_size=None):
    s, p, C, tensors, state, out = stage("numba", q, k, v, g, beta, scale, initial_state,
                                         qk_l2norm, policy, chunk_size,
                                         max_chunk=MAX_CHUNK if op == "chunked" else None)
    if p.accum_dtype != "fp32":
        raise KernelArgumentError(
            f"policy.accum_dtype: expected 'fp32' for backend 'numba', got {p.accum_dtype!r}",
            key="policy", fix="use backend='ext' or 'torch' for fp64 accumulation")
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
