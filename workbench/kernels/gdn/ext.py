"""GDN through the native kernels of ``kernels/gdn/`` (ctypes, no torch extension toolchain).

CPU tensors run the C++ build (g++, built on first use into ``$WORKBENCH_CACHE``); CUDA tensors
run the CUDA build (nvcc, ``-gencode=arch=compute_90a,code=sm_90a`` by default) on torch's current
stream. Both compute in float32 storage with dot products accumulated in ``policy.accum_dtype``
(fp32 or fp64); the state stays float32 (``state_dtype`` other than fp32 is refused by the
dispatcher, from ``KNOBS``), inputs are materialized in ``policy.input_dtype`` when set, o is
rounded to ``policy.output_dtype`` (None: v's dtype). The recurrence (decode and prefill) takes
no staging copies: its kernels read q, k, v, g and beta in float32 / bf16 / fp16 as given, apply
``qk_l2norm`` themselves, start from the initial state where it lies and write o in its dtype
(:func:`workbench.kernels.gdn._launch.stage_direct`). The helper ops are not implemented here
(``fallback="torch"`` runs torch's, recorded).

The CUDA chunked form has two paths (``cuda_path``): ``scalar`` (plain fp32 FMAs, the element code
of ``gdn_common.h``) and ``mma`` (``gdn_mma.cu``: tensor cores, tf32 operands rounded to nearest,
fp32 accumulators; chunk 64, K in {64, 128}, V in {32, 64, 96, 128}; o written in the output
dtype by the kernel; bf16 / fp16 q, k, v read as given, which gives the same result as widening
them first, since they are exact in tf32; ``qk_l2norm`` applied by the kernels to the products
they form from the raw q and k). ``auto`` takes ``mma``
for bf16/fp16 inputs (after ``policy.input_dtype``) when the shape fits and the accumulator is
fp32, else ``scalar``. The choice is the policy knob ``cuda_path`` (auto, scalar, mma);
``WORKBENCH_GDN_CUDA_PATH`` replaces its default ``auto`` only. The path taken is noted with the
call (:func:`workbench.kernels.registry.kernel_log`).

Packed batches (``cu_seqlens``) run in one launch pair per 128 sequences on the mma path (each
sequence chunked from its own first token with its own state: bit for bit the sequence alone on
the same pass); every other path runs each sequence alone (``_varlen.per_sequence``).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from typing import NamedTuple

import torch

from workbench.errors import KernelArgumentError, PolicyError
from workbench.kernels import _abi, _native
from workbench.kernels._abi import GdnArgs
from workbench.kernels.gdn._checks import check_gdn, l2norm, resolve_chunk
from workbench.kernels.gdn._launch import (DIRECT, check_direct, empty_result, stage, stage_direct, state_copy,
                                           state_source)
from workbench.kernels.registry import backend_op, note_path
from workbench.numerics.dtypes import native_code, torch_dtype
from workbench.numerics.policy import requested_cuda_path
from workbench.kernels.gdn._varlen import check_packed, per_sequence

# the ops this backend implements itself; the helper ops (gates, conv, gated norm) are torch's
# or the oracle's, reached through fallback= (workbench.kernels.registry.get_op)
OPS = ("recurrent", "chunked")
# the policy values it honours (the dispatcher refuses others)
KNOBS = {"input_dtype": None, "output_dtype": None, "accum_dtype": ("fp32", "fp64"), "state_dtype": ("fp32",),
         "chunk_size": None, "cuda_path": ("auto", "scalar", "mma")}
PATH_ENV = "WORKBENCH_GDN_CUDA_PATH"

__all__ = ["recurrent", "chunked", "is_available",
           "library"]

HEADERS = ["gdn/gdn_common.h", "gdn/gdn_mma.h", "gdn/gdn_abi.h", "common/wb_abi.h", "common/wb_elem.h",
           "common/mma_ops.h", "common/wgmma_tiles.h"]
SOURCES = {"cpu": ["gdn/gdn_cpu.cpp"], "cuda": ["gdn/gdn_cuda.cu", "gdn/gdn_mma.cu"]}
CUDA_K = (16, 32, 64, 128, 256)
MMA_K = (64, 128)
MMA_V = (32, 64, 96, 128)
MMA_OUT = {t: native_code(t) for t in (torch.float32, torch.bfloat16, torch.float16)}  # o dtypes of the mma path
MMA_IN = MMA_OUT  # q, k, v dtypes the mma path reads (g, beta: float32)

_P, _I = ctypes.c_void_p, ctypes.c_int


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
        entries = {f"gdn_recurrent_{kind}": GdnArgs, f"gdn_chunked_{kind}": GdnArgs}
        if kind == "cuda":
            entries["gdn_chunked_mma_cuda"] = GdnArgs
            plan = lib.gdn_mma_pass_plan
            plan.argtypes, plan.restype = [_I, _I, _I, _I, _I], _I
            packed = lib.gdn_chunked_mma_varlen_cuda
            packed.argtypes, packed.restype = [ctypes.POINTER(GdnArgs), _P, _I], _I
            group = lib.gdn_mma_packed_group
            group.argtypes, group.restype = [_P, _I, _I, _P, _P, _P], _I
            pplan = lib.gdn_mma_packed_pass_plan
            pplan.argtypes, pplan.restype = [_P, _I, _I, _I, _I, _I, _I, _I], _I
            lib.gdn_mma_chunk_workspace.argtypes, lib.gdn_mma_chunk_workspace.restype = [], _I
        _abi.bind(lib, entries)
        _abi.check_layout(lib, GdnArgs)
        if kind == "cpu":
            inv = lib.gdn_inverse_diag16_cpu
            inv.argtypes, inv.restype = [_P, _P, _I], _I
        lib._gdn_typed = True
    return lib


def mma_fits(s, C, acc64) -> bool:
    """Whether the tensor-core chunked path takes this problem."""
    return C == 64 and not acc64 and s.K in MMA_K and s.V in MMA_V


def inverse_diag16(A: torch.Tensor) -> torch.Tensor:
    """The four 16 x 16 diagonal blocks of (I + A)^-1 (zeros elsewhere) for strictly lower
    triangular [..., 64, 64] float32 matrices, through the CPU build of the code the mma path's
    prepare kernel runs (``kernels/gdn/gdn_mma.h``); for tests and inspection."""
    A = A.detach().to("cpu", torch.float32).contiguous()
    if A.shape[-2:] != (64, 64):
        raise KernelArgumentError(f"A: expected [..., 64, 64], got {tuple(A.shape)}", key="A")
    X = torch.zeros_like(A)
    library("cpu").gdn_inverse_diag16_cpu(A.data_ptr(), X.data_ptr(), A.numel() // 4096)
    return X


def cuda_path(s, C, acc64, input_dtype=None, policy_path: str = "auto") -> str:
    """'mma' or 'scalar' for a CUDA chunked call (see the module docstring).

    ``input_dtype``: the dtype the inputs were materialized in (None: unknown, taken as fp32);
    ``policy_path``: the policy's ``cuda_path`` (its default ``auto`` may be replaced by
    ``WORKBENCH_GDN_CUDA_PATH``).
    """
    want, source = requested_cuda_path(policy_path, PATH_ENV)
    fits = mma_fits(s, C, acc64)
    if want == "mma" and not fits:
        raise PolicyError(
            f"{source}: the tensor-core path needs chunk_size 64, fp32 "
            f"accumulators, K in {MMA_K} and V in {MMA_V}; got chunk {C}, "
            f"K={s.K}, V={s.V}, accum {'fp64' if acc64 else 'fp32'}", key="cuda_path",
            fix="use cuda_path='auto' (it falls back to the scalar path) or 'scalar'")
    if want == "auto":
        want = "mma" if fits and input_dtype in (torch.bfloat16, torch.float16) else "scalar"
    return want


@lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def elem_kind(dtype: torch.dtype) -> int:
    """The code of q, k, v's element type for gdn_mma_pass_plan (ElemKind in gdn_mma.cu): 0 bf16,
    2 fp16, 1 float32, which the mma path also runs for any other floating dtype (it converts
    them to float32 before the launch)."""
    if dtype == torch.bfloat16:
        return 0
    if dtype == torch.float16:
        return 2
    if dtype.is_floating_point:
        return 1
    raise ValueError(f"the mma path takes floating-point q, k, v, not {dtype}")


def mma_pass(B: int, HV: int, V: int, dtype: torch.dtype, sms: int | None = None, *,
             K: int = 128) -> str:
    """The pass the mma path's launcher takes for ``B`` x ``HV`` heads of ``K`` key and ``V``
    value columns with q, k, v in ``dtype``: ``"smem"`` (the shared-memory pass), ``"smem16"``
    (the same at 16 value columns a block, bit for bit: with 16-bit inputs where 32-column blocks
    would fill at most half the SMs), ``"warpN"`` (the warp-resident pass, N warps a block) or
    ``"pairN"`` (the warp-pair pass, N warps a block, two a 16-column group; only when forced),
    ``"wgmma"`` (the wgmma pass; only when forced, and only with bf16 q, k, v at K = V = 128),
    ``"wgcols"`` (the column wgmma pass; only when forced, and only with bf16 q, k, v): a forced
    wgmma pass where it does not apply is reported as the shared-memory pass that runs instead,
    on a GPU of ``sms`` SMs (None: the current CUDA device's). The launcher's own rule
    (``kernels/gdn/gdn_mma.cu``, ``WORKBENCH_GDN_MMA_PASS`` included), asked of the CUDA build;
    needs nvcc, not a GPU, when ``sms`` is given."""
    if sms is None:
        sms = _sm_count(torch.device("cuda", torch.cuda.current_device()))
    nw = library("cuda").gdn_mma_pass_plan(int(B) * int(HV), int(K), int(V), elem_kind(dtype),
                                          int(sms))
    return pass_name(nw)


def mma_packed_passes(cu_seqlens, HV: int, V: int, dtype: torch.dtype, sms: int | None = None, *,
                      K: int = 128, lib=None) -> list[str]:
    """The pass of each launch the mma path makes for a packed batch at offsets ``cu_seqlens``
    (ints; one launch per 128 sequences), named as :func:`mma_pass` names them. A launch whose grid
    gets the warp-resident pass takes the width of least estimated time over its sequences'
    lengths (a much longer sequence than the rest: narrower blocks), else the plain batches' rule
    for HV times its sequences. ``lib``: another build of the launcher (the CPU emulation's)."""
    if sms is None:
        sms = _sm_count(torch.device("cuda", torch.cuda.current_device()))
    lib = lib or library("cuda")
    n = len(cu_seqlens) - 1
    cu = (ctypes.c_int * (n + 1))(*[int(c) for c in cu_seqlens])
    return [pass_name(lib.gdn_mma_packed_pass_plan(cu, n, g0, int(HV), int(K), int(V), elem_kind(dtype), int(sms)))
            for g0 in range(0, n, PACKED_LAUNCH)]


def pass_name(code: int) -> str:
    """The name of a pass code of gdn_mma_pass_plan: 0 "smem", 1 "smem16", kPair (64) | N "pairN",
    kWg (128) "wgmma" (forced only; it runs where K = V = 128 with bf16 q, k, v, the shared-memory
    pass elsewhere), kWc (256) "wgcols" (forced only; bf16 q, k, v, else the shared-memory pass),
    else "warpN" (N warps a block)."""
    if code == 128:
        return "wgmma"
    if code == 256:
        return "wgcols"
    if code & 64:
        return f"pair{code & 63}"
    return {0: "smem", 1: "smem16"}.get(code, f"warp{code}")


PACKED_LAUNCH = 128  # sequences a packed launch of the mma path takes (kSeqs in gdn_mma.cu)
# floats of one chunk's workspace on the mma path (kChunkWs in gdn_mma.cu): Tinv and PT, 64 x 64
# each, then five rows of 64 per-position factors for the passes
MMA_CHUNK_WS = 2 * 64 * 64 + 5 * 64


def mma_packed_launches(cu_seqlens) -> list[dict]:
    """The launches the mma path makes for a packed batch at offsets ``cu_seqlens`` (ints,
    checked), as its launcher builds them (host code of the CUDA build; needs nvcc, not a GPU):
    per launch the first sequence, the token offsets and the chunk offsets of its sequences (each
    chunked from its own first token) and its chunks. Launches of empty sequences only are made
    but launch nothing."""
    lib = library("cuda")
    n = len(cu_seqlens) - 1
    cu = (ctypes.c_int * (n + 1))(*cu_seqlens)
    out, g0 = [], 0
    while g0 < n:
        tok, chk, nc = (ctypes.c_int * (PACKED_LAUNCH + 1))(), (ctypes.c_int * (PACKED_LAUNCH + 1))(), ctypes.c_int()
        m = lib.gdn_mma_packed_group(cu, n, g0, tok, chk, ctypes.byref(nc))
        out.append({"first": g0, "sequences": m, "tok": list(tok[:m + 1]), "chk": list(chk[:m + 1]),
                    "chunks": nc.value})
        g0 += m
    return out


def mma_packed_workspace_chunks(cu_seqlens) -> int:
    """Chunks of the workspace a packed batch at offsets ``cu_seqlens`` needs on the mma path: the
    most of any one launch (its launches run one after another on the stream and reuse it)."""
    chunks = [-(-(b - a) // 64) for a, b in zip(cu_seqlens[:-1], cu_seqlens[1:])]
    return max((sum(chunks[g:g + PACKED_LAUNCH]) for g in range(0, len(chunks), PACKED_LAUNCH)), default=0)


def _refuse_mma(op: str, q: torch.Tensor):
    raise PolicyError(f"policy.cuda_path='mma': the tensor-core path exists for the CUDA chunked form only, "
                      f"not for {op} on {q.device.type} tensors", key="cuda_path",
                      fix="use cuda_path='auto' or 'scalar'")


class Staged(NamedTuple):
    """What ``recurrent`` / ``chunked`` hand to :func:`launch` (see :func:`staged`)."""
    s: object             # the checked shape
    policy: object
    chunk: int
    acc64: int
    tensors: tuple        # q, k, v, g, beta, contiguous
    state: torch.Tensor   # float32 copy of the initial state (or zeros)
    out: torch.dtype      # o's dtype
    path: str             # CUDA chunked path: "mma" or "scalar"
    qk_l2norm: bool       # the L2 norm of q and k is still to be applied (by the mma kernels)
    # copy=False on the mma path: state is a new tensor the kernels only write, and they read the
    # initial state from h0 (float32, where the caller's lies), or zeros (zero_state)
    h0: object = None
    zero_state: bool = False


@backend_op
def staged(op, q, k, v, g, beta, scale=None, initial_state=None, qk_l2norm=False, policy=None,
           chunk_size=None, copy=True) -> Staged:
    """Inputs as the kernels of ``op`` take them. On the mma path q, k, v stay bf16 / fp16 (else
    they are widened to float32) and ``qk_l2norm`` is left to the kernels; elsewhere q and k are
    normalized here, in float32. The state is a float32 copy of the initial state that the
    kernels update in place, except with ``copy=False`` on the mma path (see :class:`Staged`)."""
    s, p, C, tensors, _, out = stage("ext", q, k, v, g, beta, scale, initial_state, False,
                                     policy, chunk_size, widen=False, state=False)
    acc64 = int(p.accum_dtype == "fp64")
    path = "scalar"
    if op == "chunked" and tensors[0].is_cuda:
        path = cuda_path(s, C, acc64, torch_dtype(p.input_dtype) if p.input_dtype else q.dtype, p.cuda_path)
    elif p.cuda_path == "mma":
        _refuse_mma(op, tensors[0])
    # the kernel log gets the mma path's pass too ("mma/smem", "mma/warp4", ...), asked only
    # while a log records
    note_path(path if path != "mma" else
              lambda: f"mma/{mma_pass(s.B, s.HV, s.V, tensors[0].dtype, _sm_count(tensors[0].device), K=s.K)}")
    if not (path == "mma" and tensors[0].dtype in (torch.bfloat16, torch.float16)):
        tensors = (*(x.to(torch.float32).contiguous() for x in tensors[:3]), *tensors[3:])
    if qk_l2norm and path != "mma":
        tensors = (l2norm(tensors[0]).contiguous(), l2norm(tensors[1]).contiguous(), *tensors[2:])
    l2 = bool(qk_l2norm and path == "mma")
    if path == "mma" and not copy:
        h0 = state_source(initial_state)
        state = torch.empty(s.B, s.HV, s.K, s.V, dtype=torch.float32, device=tensors[0].device)
        return Staged(s, p, C, acc64, tensors, state, out, path, l2, h0, h0 is None)
    state = state_copy(s, initial_state, tensors[0].device)
    return Staged(s, p, C, acc64, tensors, state, out, path, l2)


def _recurrent(q, k, v, g, beta, scale, initial_state, qk_l2norm, policy):
    """The recurrence without staging copies: the kernels read q, k, v, g and beta in their
    dtypes (float32, bf16, fp16; q, k, v, beta materialized in ``policy.input_dtype`` first when
    set), apply ``qk_l2norm`` themselves, read the initial state where it is (float32) and write
    the final state to a new tensor and o in the output dtype."""
    p = policy
    if p.cuda_path == "mma":
        _refuse_mma("recurrent", q)
    note_path("scalar")
    s, tensors, h0, state, o, out = stage_direct(q, k, v, g, beta, scale, initial_state, p)
    if s.T == 0 or s.B == 0:
        state = empty_result(h0, state)
    else:
        launch("recurrent", s, 0, int(p.accum_dtype == "fp64"), tensors, state, o,
               qk_l2norm=qk_l2norm, h0=h0, zero_state=h0 is None)
    return o.to(out), state


def _run(op, q, k, v, g, beta, scale, initial_state, qk_l2norm, policy, chunk_size=None):
    if op == "recurrent":
        return _recurrent(q, k, v, g, beta, scale, initial_state, qk_l2norm, policy)
    # the mma path reads the initial state where it lies and writes the final state to a new
    # tensor (no copy of the state first); the scalar paths update a copy in place
    st = staged(op, q, k, v, g, beta, scale, initial_state, qk_l2norm, policy=policy, chunk_size=chunk_size,
                copy=False)
    s, C, acc64, tensors, state, out, path = (st.s, st.chunk, st.acc64, st.tensors, st.state,
                                              st.out, st.path)
    # the mma path writes o in the output dtype itself (round to nearest even, as .to() does)
    odt = out if path == "mma" and out in MMA_OUT else torch.float32
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=odt, device=tensors[0].device)
    if s.T > 0 and s.B > 0:
        launch(op, s, C, acc64, tensors, state, o, path=path, qk_l2norm=st.qk_l2norm, h0=st.h0,
               zero_state=st.zero_state)
    elif path == "mma":
        state = empty_result(st.h0, state)
    return o.to(out), state


def launch(op, s, C, acc64, tensors, state, o, path="scalar", qk_l2norm=False, h0=None, zero_state=False,
           cu_seqlens=None, lib=None):
    """Run the native kernel on staged contiguous tensors (float32; see ``path`` for the mma
    path's bf16 / fp16); ``state`` is updated in place.

    The recurrence (``op`` "recurrent", CPU and CUDA builds) reads q, k, v (one dtype), g and beta
    in any of float32, bf16, fp16 and writes ``o`` in any of them; it applies ``qk_l2norm``
    itself. It and the CUDA mma path take ``h0`` (float32 [B, HV, K, V], or one state per
    sequence of a packed batch; not ``state``): they start from h0 and only write ``state``; with
    ``zero_state`` from zeros (neither is read); else ``state`` is read and written in place.

    ``path`` ("scalar" or "mma") picks the CUDA chunked kernels; CPU tensors and the recurrence
    always run the scalar code. ``o`` is float32, except on the mma path, which also writes bf16
    or fp16 ``o`` directly (rounded to nearest even from its float32 result) and also reads bf16
    or fp16 q, k, v (all three alike; g and beta float32) and applies ``qk_l2norm`` itself
    (other paths take q and k normalized already). On the mma path ``cu_seqlens`` (the packed
    batch's offsets, ints, checked) runs a packed batch (B = 1, ``state`` one per sequence) in one
    launch pair per 128 sequences.

    ``lib``: another build of the CUDA build's entry points, run on CPU tensors as the CUDA build
    would be (the host emulations, :mod:`cuda_emu` and :mod:`mma_emu`).
    """
    q = tensors[0]
    kind = "cuda" if q.is_cuda or lib is not None else "cpu"
    if not q.is_cuda and q.device.type != "cpu":
        raise KernelArgumentError(f"q: expected a CPU or CUDA tensor for backend 'ext', got "
                                  f"device {q.device}", key="q")
    if kind == "cuda" and op == "recurrent" and s.K not in CUDA_K:
        raise KernelArgumentError(f"q: expected K in {CUDA_K} for the CUDA recurrence, got K={s.K}",
                                  key="q", fix="use backend='torch' or the chunked form")
    if qk_l2norm and not (op == "recurrent" or (kind == "cuda" and path == "mma")):
        raise KernelArgumentError("qk_l2norm: only the recurrence and the mma path apply the L2 norm "
                                  "themselves; normalize q and k first (ext.staged does)", key="qk_l2norm")
    lib = lib or library(kind)
    a = GdnArgs.of(q=tensors[0], k=tensors[1], v=tensors[2], g=tensors[3], beta=tensors[4], o=o, state=state,
                   B=s.B, T=s.T, H=s.H, HV=s.HV, K=s.K, V=s.V, scale=s.scale, chunk=C, acc64=acc64)
    if q.is_cuda:
        with torch.cuda.device(q.device):
            a.stream = torch.cuda.current_stream().cuda_stream
    if op == "recurrent":
        _recurrence_args(a, tensors, o, state, h0, zero_state, qk_l2norm)
        rc = getattr(lib, f"gdn_recurrent_{kind}")(ctypes.byref(a))
    else:
        if kind == "cuda" and path == "mma":
            _initial_state_args(a, state, h0, zero_state)
            return _launch_mma(lib, a, s, C, acc64, tensors, o, qk_l2norm, cu_seqlens)
        if cu_seqlens is not None:
            raise KernelArgumentError("cu_seqlens: only the CUDA mma path runs a packed batch in one launch",
                                      key="cu_seqlens", fix="run each sequence alone (_varlen.per_sequence)")
        f32 = dict(dtype=torch.float32, device=q.device)
        # workspace of the three-phase chunked form: gcum, W, U
        ws = (torch.empty(s.B, s.HV, s.T, **f32), torch.empty(s.B, s.HV, s.T, s.K, **f32),
              torch.empty(s.B, s.HV, s.T, s.V, **f32))
        a.gcum, a.W, a.U = (w.data_ptr() for w in ws)
        rc = getattr(lib, f"gdn_chunked_{kind}")(ctypes.byref(a))
    if rc != _abi.WB_OK:
        raise _abi.status_error(lib, rc, f"native gdn {op} ({kind})")


def _launch_mma(lib, a, s, C, acc64, tensors, o, qk_l2norm, cu_seqlens=None):
    """The mma path's launch (GdnArgs ``a`` filled but for the workspace and dtypes): a batch, or a
    packed batch at offsets ``cu_seqlens``."""
    q = tensors[0]
    if not mma_fits(s, C, acc64):
        raise KernelArgumentError(f"path: the mma path does not take chunk {C}, K={s.K}, "
                                  f"V={s.V}, acc64={acc64}", key="backend")
    if o.dtype not in MMA_OUT:
        raise KernelArgumentError(f"o: the mma path writes {list(MMA_OUT)}, got {o.dtype}", key="o")
    if len({x.dtype for x in tensors[:3]}) != 1 or q.dtype not in MMA_IN:
        raise KernelArgumentError(
            f"q, k, v: the mma path reads one of {list(MMA_IN)} for all three, got "
            f"{[x.dtype for x in tensors[:3]]}", key="q")
    # workspace: each chunk's (I + A)^-1, P (I + A)^-1 and the passes' factor rows (tinv; a packed
    # batch's sequences are chunked from their own first tokens); the L2-norm factors of the q and
    # k rows (computed by the kernels), or none
    f32 = dict(dtype=torch.float32, device=q.device)
    if cu_seqlens is None:
        tinv = torch.empty(s.B, s.HV, -(-s.T // 64), MMA_CHUNK_WS, **f32)
    else:
        tinv = torch.empty(s.HV, mma_packed_workspace_chunks(cu_seqlens), MMA_CHUNK_WS, **f32)
    ws = [tinv]
    if qk_l2norm:
        ws += [torch.empty(s.B, s.T, s.H, **f32) for _ in range(2)]
        a.nq, a.nk = ws[1].data_ptr(), ws[2].data_ptr()
    a.tinv = tinv.data_ptr()
    a.in_dtype, a.o_dtype = MMA_IN[q.dtype], MMA_OUT[o.dtype]
    if cu_seqlens is None:
        rc = lib.gdn_chunked_mma_cuda(ctypes.byref(a))
    else:
        n = len(cu_seqlens) - 1
        rc = lib.gdn_chunked_mma_varlen_cuda(ctypes.byref(a), (ctypes.c_int * (n + 1))(*cu_seqlens), n)
    if rc != _abi.WB_OK:
        raise _abi.status_error(lib, rc, "native gdn chunked (cuda, mma)", fix="policy cuda_path='scalar'")


def _packed_mma(q, k, v, g, beta, scale, initial_state, qk_l2norm, chunk_size, cu_seqlens, policy):
    """A packed batch on the CUDA mma path, one launch pair per 128 sequences (each sequence
    chunked from its own first token, with its own state: the arithmetic of the sequence run
    alone on the same pass); None where the call does not take the mma path (the caller then runs
    each sequence alone)."""
    if not (isinstance(q, torch.Tensor) and q.is_cuda):
        return None
    offs = check_packed(q, k, v, cu_seqlens, initial_state)
    n = len(offs) - 1
    s = check_gdn(q, k, v, g, beta, scale, None if initial_state is None else initial_state[:1])
    p = policy
    C, acc64 = resolve_chunk(chunk_size, p), int(p.accum_dtype == "fp64")
    if cuda_path(s, C, acc64, torch_dtype(p.input_dtype) if p.input_dtype else q.dtype, p.cuda_path) != "mma":
        return None
    st = staged("chunked", q, k, v, g, beta, scale, None, qk_l2norm, policy=p, chunk_size=chunk_size,
                copy=False)
    # the pass of the (first) launch
    note_path(lambda: f"mma/{mma_packed_passes(offs, s.HV, s.V, st.tensors[0].dtype, _sm_count(q.device), K=s.K)[0]}")
    # one state per sequence, read where it lies; the final states to a new tensor
    h0 = state_source(initial_state)
    state = torch.empty(n, s.HV, s.K, s.V, dtype=torch.float32, device=q.device)
    odt = st.out if st.out in MMA_OUT else torch.float32
    o = torch.empty(1, s.T, s.HV, s.V, dtype=odt, device=q.device)
    if s.T > 0:
        launch("chunked", s, C, acc64, st.tensors, state, o, path="mma", qk_l2norm=st.qk_l2norm, cu_seqlens=offs,
               h0=h0, zero_state=h0 is None)
    else:
        state = empty_result(h0, state)
    return o.to(st.out), state


def _initial_state_args(a, state, h0, zero_state):
    """Fill GdnArgs ``a``'s initial state: h0 (checked; the buffer of ``state`` itself: in place),
    or zeros (``zero_state``), or ``state`` read in place."""
    if h0 is not None:
        if h0.dtype != torch.float32 or not h0.is_contiguous() or h0.shape != state.shape:
            raise KernelArgumentError(f"h0: expected a contiguous float32 tensor of shape {tuple(state.shape)}, got "
                                      f"{h0.dtype} {tuple(h0.shape)}", key="initial_state")
        if h0.device != state.device:
            raise KernelArgumentError(f"h0: expected a tensor on {state.device}, got {h0.device}",
                                      key="initial_state")
        if h0.data_ptr() == state.data_ptr():
            h0 = None  # the same buffer: the state is read and written in place
    a.h0 = h0.data_ptr() if h0 is not None else None
    a.zero_state = int(bool(zero_state))


def _recurrence_args(a, tensors, o, state, h0, zero_state, qk_l2norm):
    """Fill the recurrence's dtype codes, initial state and norm flag of GdnArgs ``a``."""
    check_direct("ext", tensors, o)
    q, _, _, g, beta = tensors
    _initial_state_args(a, state, h0, zero_state)
    a.in_dtype, a.g_dtype, a.beta_dtype, a.o_dtype = (DIRECT[x.dtype] for x in (q, g, beta, o))
    a.qk_l2norm = int(bool(qk_l2norm))


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
    if cu_seqlens is not None:  # a packed batch: no chunk crosses a boundary; the mma path in one
        # launch (per 128 sequences), else each sequence alone
        packed = _packed_mma(q, k, v, g, beta, scale, initial_state, qk_l2norm, chunk_size, cu_seqlens, policy)
        if packed is not None:
            return packed
        return per_sequence(chunked, q, k, v, g, beta, cu_seqlens, initial_state, scale=scale,
                            qk_l2norm=qk_l2norm, chunk_size=chunk_size, policy=policy)
    return _run("chunked", q, k, v, g, beta, scale, initial_state, qk_l2norm, policy, chunk_size)
