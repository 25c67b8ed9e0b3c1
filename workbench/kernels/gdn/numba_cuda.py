"""GDN as numba.cuda kernels: the recurrence (batched decode and prefill) and a chunked prefill.

Kernels (each built by a factory whose arguments become compile-time constants, so loops over
the K rows unroll and the state lives in registers):

- ``recurrent`` (decode, T = 1, and prefill): a block of 8 (or 4) warps-worth of threads owns BV
  value columns of one (b, hv); thread (slice w, lane) keeps K / 8 state rows of its column in
  registers; each step stages q_t and k_t in shared memory and partial dot products meet there.
  It reads q, k, v, g and beta in the dtypes given (float32, bf16, fp16), applies the q/k L2
  norm itself, reads the initial state where it lies and writes o in the output dtype, so a
  public decode call launches this one kernel and no staging copies (one compiled variant per
  combination, on first use);
- ``chunked`` (prefill), the UT/WY form in three launches: ``prepare`` (one block per chunk, all
  chunks in parallel) builds A = strictly-lower(beta K K^T * decay) in shared memory and solves
  (I + A) [W U] = [beta exp(gc) K, beta V] by forward substitution; ``state_pass`` (one block per
  (b, hv, 16 value columns), sequential over chunks, state tile in shared memory) turns U into the
  chunk's delta-rule values U - W S, writes the inter-chunk part of o and the next state;
  ``output`` (one block per chunk) adds the intra-chunk part tril(q k^T * decay) U.

Kernels compute in float32 (the chunked form's inputs are staged to float32 by the launcher; ``policy.accum_dtype``
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
from workbench.kernels.gdn._launch import DIRECT, check_direct, empty_result, stage, stage_direct
from workbench.kernels.registry import backend_op, note_path
from workbench.kernels.gdn._varlen import per_sequence

try:  # kernels must see the module-level ``cuda``: the simulator swaps it in their globals
    from numba import cuda, float32, int64, uint64

    from workbench.kernels._numba_elem import _ld, _st
except Exception as _e:  # pragma: no cover - is_available() reports it
    cuda = float32 = int64 = uint64 = _ld = _st = None
    _IMPORT_ERROR = f"{type(_e).__name__}: {_e}"

# the ops this backend implements itself; the helper ops (gates, conv, gated norm) are torch's
# or the oracle's, reached through fallback= (workbench.kernels.registry.get_op)
OPS = ("recurrent", "chunked")
DEVICES = ("cuda",)  # CUDA tensors (the numba simulator runs CPU tensors, tiny grids, for tests)

__all__ = ["recurrent", "chunked", "is_available",
           "kernel_sources"]

NS = 4                 # K slices per value column in the recurrence: K must divide by it
RNS = 8                # ... and the slices it uses when K divides by them (half the registers)
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

# array types of the dtype codes the recurrence reads and writes (bf16 travels as int16 bits)
_ARR = {0: "float32", 1: "int16", 2: "float16"}
INIT_STATE, INIT_H0, INIT_ZERO = 0, 1, 2   # the recurrence's initial state: in place, from h0, zeros


def _recurrent_sig(DQ: int, DG: int, DB: int, DO: int):
    from numba import types
    arr = {c: getattr(types, n)[::1] for c, n in _ARR.items()}
    f1, i32 = types.float32[::1], types.int32
    return types.void(arr[DQ], arr[DQ], arr[DQ], arr[DG], arr[DB], arr[DO], f1, f1, i32, i32, i32, i32,
                      types.float32)


def _slices(K: int) -> int:
    """K slices per value column of the recurrence: RNS when K divides by it, else NS."""
    return RNS if K % RNS == 0 else NS


def _recurrent_src(K: int, BV: int, DQ: int = 0, DG: int = 0, DB: int = 0, DO: int = 0,
                   INIT: int = INIT_STATE, L2: bool = False):
    """The recurrence (decode: T = 1; prefill: a loop over T), on flat contiguous arrays.

    A block of S x BV threads (S = 8 K slices, 4 when K does not divide by 8) owns BV value
    columns of one (b, hv); thread (slice w, lane) keeps K / S state rows of its column in
    registers. Each step stages q_t and k_t in shared memory (read in dtype code DQ, as are v;
    g in DG, beta in DB: 0 float32, 1 bf16 bits, 2 fp16, widened exactly); with L2 the L2-norm
    factors of the q and k rows are formed from them by warps 0 and 1 (32 lane-strided partial
    sums and an xor butterfly, the order of the ext kernels; with fewer than 64 threads, K not a
    multiple of 32, or in the simulator, the same sums meet in shared memory in the same order)
    and q_t, k_t scaled in place; partial dot products meet in shared memory. o is written in
    DO, rounded once to nearest even. The initial state comes from ``state`` itself (INIT_STATE), from ``h0``
    (INIT_H0) or is zeros (INIT_ZERO); the final state is written to ``state``.
    """
    NS = _slices(K)
    RK = K // NS
    NT = NS * BV
    SHFL = NT >= 64 and K % 32 == 0 and not _simulator()  # the simulator has no warp shuffles
    KW = K // 32

    def gdn_recurrent(q, k, v, g, beta, o, h0, state, T, H, HV, V, scale):
        red = cuda.shared.array((NS, BV), float32)
        qk = cuda.shared.array((2, K), float32)
        part = cuda.shared.array((2, 32), float32)
        nrm = cuda.shared.array(2, float32)
        s = cuda.local.array(RK, float32)
        bh = int64(cuda.blockIdx.x)
        b = bh // HV
        hv = bh % HV
        h = hv // (HV // H)
        tid = cuda.threadIdx.x
        lane = tid % BV
        w = tid // BV
        c = cuda.blockIdx.y * BV + lane
        active = c < V
        # unsigned flat indices: numba adds no negative-index wraparound to them
        base = uint64((bh * K + w * RK) * V + c)
        for i in range(RK):  # all state loads first, so they are in flight together
            if INIT == INIT_ZERO or not active:
                s[i] = float32(0.0)
            elif INIT == INIT_H0:
                s[i] = h0[base + uint64(i * V)]
            else:
                s[i] = state[base + uint64(i * V)]
        for t in range(T):
            row = uint64(((b * T + t) * H + h) * K)
            for i in range(tid, K, NT):
                qk[0, i] = _ld(q, row + uint64(i), DQ)
                qk[1, i] = _ld(k, row + uint64(i), DQ)
            gi = uint64((b * T + t) * HV + hv)
            decay = math.exp(_ld(g, gi, DG))
            bt = _ld(beta, gi, DB)
            vi = _ld(v, gi * uint64(V) + uint64(c), DQ) if active else float32(0.0)
            cuda.syncthreads()
            if L2:  # q_t and k_t scaled in shared memory by their factors (so the loops below
                # hold no extra registers): x * f, the product the ext kernels form
                if SHFL:  # warps 0 and 1 form the q and k factors: lane sums, xor butterfly
                    if tid < 64:
                        j = tid // 32
                        acc = float32(0.0)
                        for r in range(KW):
                            x = qk[j, tid % 32 + 32 * r]
                            acc += x * x
                        acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, 16)
                        acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, 8)
                        acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, 4)
                        acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, 2)
                        acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, 1)
                        f = float32(1.0) / math.sqrt(acc + float32(1e-6))  # every lane holds the sum
                        for r in range(KW):
                            qk[j, tid % 32 + 32 * r] = qk[j, tid % 32 + 32 * r] * f
                else:  # under 64 threads (V < 16), or the simulator: the same sums, tree in shared memory
                    for idx in range(tid, 64, NT):
                        j = idx // 32
                        acc = float32(0.0)
                        for i in range(idx % 32, K, 32):
                            acc += qk[j, i] * qk[j, i]
                        part[j, idx % 32] = acc
                    cuda.syncthreads()
                    if tid < 2:
                        off = 16
                        while off > 0:
                            for m in range(off):
                                part[tid, m] = part[tid, m] + part[tid, m + off]
                            off //= 2
                        nrm[tid] = float32(1.0) / math.sqrt(part[tid, 0] + float32(1e-6))
                    cuda.syncthreads()
                    for i in range(tid, K, NT):
                        qk[0, i] = qk[0, i] * nrm[0]
                        qk[1, i] = qk[1, i] * nrm[1]
                cuda.syncthreads()
            p = float32(0.0)
            for i in range(RK):
                p += s[i] * qk[1, w * RK + i]
            red[w, lane] = p
            cuda.syncthreads()
            kv = float32(0.0)
            for j in range(NS):
                kv += red[j, lane]
            u = bt * (vi - decay * kv)
            po = float32(0.0)
            for i in range(RK):
                s[i] = decay * s[i] + qk[1, w * RK + i] * u
                po += s[i] * qk[0, w * RK + i]
            cuda.syncthreads()
            red[w, lane] = po
            cuda.syncthreads()
            if w == 0 and active:
                acc = float32(0.0)
                for j in range(NS):
                    acc += red[j, lane]
                _st(o, gi * uint64(V) + uint64(c), scale * acc, DO)
        if active:
            for i in range(RK):
                state[base + uint64(i * V)] = s[i]

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
        "recurrent": _recurrent_sig(0, 0, 0, 0),
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
    """{name: (python function, signature)} of every kernel as launched for K, V and chunk C
    (the recurrence in two of its variants: float32 in place, and a decode step as engines call
    it: bf16 q, k, v and o, float32 g and beta, state from h0, L2 norm in the kernel); the CI
    compiles each to PTX for sm_90."""
    sig = _sigs()
    cfg = _config(K, V, C)
    return {
        "recurrent": (_recurrent_src(K, cfg["bv"]), sig["recurrent"]),
        "recurrent_bf16_h0_l2": (_recurrent_src(K, cfg["bv"], 1, 0, 0, 1, INIT_H0, True), _recurrent_sig(1, 0, 0, 1)),
        "prepare": (_prepare_src(K, V, C, cfg["phase"]), sig["prepare"]),
        "state_pass": (_state_pass_src(K, cfg["pass_bv"], C, cfg["pass_threads"]), sig["state_pass"]),
        "output": (_output_src(K, V, C, cfg["phase"]), sig["output"]),
    }


@lru_cache(maxsize=None)
def _kernel(name: str, K: int, V: int, C: int):
    fn, sig = kernel_sources(K, V, C)[name]
    return cuda.jit(sig)(fn) if not _simulator() else cuda.jit(fn)


@lru_cache(maxsize=None)
def _recurrence(K: int, BV: int, codes: tuple, init: int, l2: bool):
    """The recurrence compiled for one combination of dtype codes (q/k/v, g, beta, o), initial
    state and norm (each compiled on first use, then cached)."""
    fn = _recurrent_src(K, BV, *codes, init, l2)
    return cuda.jit(_recurrent_sig(*codes))(fn) if not _simulator() else cuda.jit(fn)


def _flat(x: torch.Tensor) -> torch.Tensor:
    """x as the flat array the recurrence reads (bf16 as its int16 bits)."""
    x = x.reshape(-1)
    return x.view(torch.int16) if x.dtype == torch.bfloat16 else x


def _check_k(s) -> None:
    if s.K % NS:
        raise KernelArgumentError(f"q: expected K divisible by {NS} for backend 'numba', got "
                                  f"K={s.K}", key="q", fix="use backend='torch' or 'ext'")


def recurrence(s, tensors, state, o, h0=None, zero_state=False, qk_l2norm=False):
    """Run the recurrence on contiguous tensors: q, k, v (one dtype), g, beta in float32, bf16 or
    fp16, o in one of them; the initial state from ``h0`` (float32, not ``state``), zeros
    (``zero_state``) or ``state`` itself; the final state in ``state`` (float32)."""
    _check_k(s)
    check_direct("numba", tensors, o)
    q, k, v, g, beta = tensors
    if h0 is not None and h0.data_ptr() == state.data_ptr():
        h0 = None
    init = INIT_ZERO if zero_state else (INIT_H0 if h0 is not None else INIT_STATE)
    bv = _config(s.K, s.V, 0)["bv"]
    codes = tuple(DIRECT[x.dtype] for x in (q, g, beta, o))
    kern = _recurrence(s.K, bv, codes, init, bool(qk_l2norm))
    st = _flat(state)
    _go(kern, (s.B * s.HV, (s.V + bv - 1) // bv), _slices(s.K) * bv,
        [*(_flat(x) for x in (q, k, v, g, beta, o)), _flat(h0) if h0 is not None else st, st,
         s.T, s.H, s.HV, s.V, s.scale], q.device)


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
    """Run ``name`` ("decode" or "recurrent": the recurrence, see :func:`recurrence`; "chunked")
    on staged float32 tensors; ``state`` is updated in place."""
    if name in ("decode", "recurrent"):
        recurrence(s, tensors, state, o)
        return
    _check_k(s)
    q, k, v, g, beta = tensors
    dev = q.device
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


def _need_device(q):
    if not q.is_cuda and not _simulator():
        raise KernelArgumentError(
            f"q: expected CUDA tensors for backend 'numba', got device {q.device}",
            key="q", fix="move the tensors to the GPU (x.cuda()), or set NUMBA_ENABLE_CUDASIM=1 "
                         "before importing numba to use the simulator")


def _recurrent(q, k, v, g, beta, scale, initial_state, qk_l2norm, policy):
    """The recurrence without staging copies (``_launch.stage_direct``)."""
    s, tensors, h0, state, o, out = stage_direct(q, k, v, g, beta, scale, initial_state, policy)
    note_path("scalar")
    _need_device(tensors[0])
    if s.T == 0 or s.B == 0:
        state = empty_result(h0, state)
    else:
        recurrence(s, tensors, state, o, h0=h0, zero_state=h0 is None, qk_l2norm=qk_l2norm)
    return o.to(out), state


def _run(op, q, k, v, g, beta, scale, initial_state, qk_l2norm, policy, chunk_size=None):
    if op == "recurrent":
        return _recurrent(q, k, v, g, beta, scale, initial_state, qk_l2norm, policy)
    s, p, C, tensors, state, out = stage("numba", q, k, v, g, beta, scale, initial_state,
                                         qk_l2norm, policy, chunk_size)
    note_path("scalar")
    _need_device(tensors[0])
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=torch.float32, device=tensors[0].device)
    if s.T > 0:
        launch(op, s, C, tensors, state, o)
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
