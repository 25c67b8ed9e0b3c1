"""The host emulation of CUDA (kernels/common/cuda_emu.h) that runs the tensor-core kernels on
the CPU, checked against the PTX ISA's own definitions with small kernels written for it
(kernels/common/cuda_emu_selftest.cpp): what the GDN mma tests on the emulation rest on."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from workbench.kernels import _native

pytestmark = pytest.mark.skipif(_native.find_cxx() is None, reason="no C++ compiler")

_P = ctypes.c_void_p


@pytest.fixture(scope="module")
def lib():
    lib = _native.load("cuda_emu_selftest", ["common/cuda_emu_selftest.cpp"], kind="cpu",
                       headers=["common/cuda_emu.h", "common/mma_frags.h", "common/mma_ops.h",
                                "common/wgmma_probe.h"])
    for name in ("emu_mma", "emu_mma16", "emu_ldmatrix", "emu_shfl", "emu_cp_async", "emu_named_barriers", "emu_deadlock"):
        getattr(lib, name).restype = ctypes.c_int
    lib.emu_ldmatrix.argtypes = [ctypes.c_int, _P]
    lib.emu_last_failure.restype = ctypes.c_char_p
    return lib


def ptr(a: np.ndarray):
    return a.ctypes.data_as(_P)


def test_mma_m16n8k8_tf32_fragments(lib):
    """D = A B + C through the fragment tables of the PTX ISA, exact on small integers; operands'
    low 13 bits are ignored (tf32), not rounded."""
    rng = np.random.default_rng(0)
    A = rng.integers(-8, 9, (16, 8)).astype(np.float32)
    B = rng.integers(-8, 9, (8, 8)).astype(np.float32)
    C = rng.integers(-50, 51, (16, 8)).astype(np.float32)
    D = np.full((16, 8), np.nan, np.float32)
    assert lib.emu_mma(ptr(A), ptr(B), ptr(C), ptr(D)) == 0
    np.testing.assert_array_equal(D, A @ B + C)
    # 1 + 2^-12 is not a tf32 value: the tensor cores read it as 1
    A2 = np.zeros((16, 8), np.float32)
    A2[3, 5] = np.float32(1 + 2.0 ** -12)
    B2 = np.eye(8, dtype=np.float32)
    D2 = np.zeros((16, 8), np.float32)
    assert lib.emu_mma(ptr(A2), ptr(B2), ptr(np.zeros((16, 8), np.float32)), ptr(D2)) == 0
    assert D2[3, 5] == 1.0 and np.count_nonzero(D2) == 1


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """The bf16 bits of float32 values that bf16 holds exactly."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    assert not (u & 0xFFFF).any(), "not bf16 values"
    return (u >> 16).astype(np.uint16)


def test_mma_m16n8k16_bf16_fragments(lib):
    """D = A B + C through the m16n8k16 .bf16 fragment tables of the PTX ISA (two values a
    register, the lower k in the low half), exact on small integers; a product of two bf16 is exact
    in float32 (the sum of 1 + 2^-7 squared keeps its 2^-14 term)."""
    rng = np.random.default_rng(1)
    A = rng.integers(-8, 9, (16, 16)).astype(np.float32)
    B = rng.integers(-8, 9, (16, 8)).astype(np.float32)
    C = rng.integers(-50, 51, (16, 8)).astype(np.float32)
    D = np.full((16, 8), np.nan, np.float32)
    assert lib.emu_mma16(ptr(bf16_bits(A)), ptr(bf16_bits(B)), ptr(C), ptr(D)) == 0
    np.testing.assert_array_equal(D, A @ B + C)
    A2 = np.zeros((16, 16), np.float32)
    B2 = np.zeros((16, 8), np.float32)
    x = np.float32(1 + 2.0 ** -7)  # a bf16 value
    A2[5, 11], B2[11, 6] = x, x
    D2 = np.zeros((16, 8), np.float32)
    assert lib.emu_mma16(ptr(bf16_bits(A2)), ptr(bf16_bits(B2)), ptr(np.zeros((16, 8), np.float32)),
                         ptr(D2)) == 0
    assert D2[5, 6] == np.float32(x) * np.float32(x) == 1 + 2.0 ** -6 + 2.0 ** -14
    assert np.count_nonzero(D2) == 1


@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_x4(lib, trans):
    """Lane l of the result holds, for tile m, row l / 4 and columns 2 (l % 4), +1 of the tile
    (trans: of the transposed tile), the lower column in the low half."""
    out = np.zeros((32, 4), np.uint32)
    assert lib.emu_ldmatrix(int(trans), ptr(out)) == 0
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for m in range(4):
            v = (lambda r, c: 64 * m + 8 * r + c)
            lo, hi = (v(2 * t, g), v(2 * t + 1, g)) if trans else (v(g, 2 * t), v(g, 2 * t + 1))
            assert out[lane, m] == lo | (hi << 16), (lane, m)


def test_shuffles(lib):
    out = np.zeros(64, np.float32)
    assert lib.emu_shfl(ptr(out)) == 0
    lanes = np.arange(32)
    np.testing.assert_array_equal(out[:32], lanes ^ 5)
    np.testing.assert_array_equal(out[32:], np.where(lanes >= 3, lanes - 3, lanes))


@pytest.mark.parametrize("mode", ["late", "eager"])
def test_cp_async_lands_at_wait_or_issue(lib, mode, monkeypatch):
    monkeypatch.setenv("WB_EMU_CP", mode)
    src = np.array([7, 8, 9, 10], np.float32)
    out = np.zeros(2, np.float32)
    assert lib.emu_cp_async(ptr(src), ptr(out)) == 0
    assert out[1] == 7 and out[0] == (-1 if mode == "late" else 7)


@pytest.mark.parametrize("sched", ["lockstep", "skew"])
def test_named_barriers(lib, sched, monkeypatch):
    monkeypatch.setenv("WB_EMU_SCHED", sched)
    out = np.zeros(4, np.int32)
    assert lib.emu_named_barriers(ptr(out)) == 0
    np.testing.assert_array_equal(out, [2, 2, 2, 2])


def test_a_barrier_never_reached_fails_the_launch(lib):
    """No hang: the launch ends with cudaErrorLaunchFailure (719) and says why."""
    out = np.zeros(1, np.int32)
    assert lib.emu_deadlock(ptr(out)) == 719
    assert b"deadlock" in lib.emu_last_failure() and out[0] == 0


# ------------------------------------------------- the models against the tensor cores (GPU)

def _mixed(rng, shape, exp=6):
    """float32 values of mixed sign and magnitude (2^-exp .. 2^exp), full 24-bit significands."""
    return (rng.choice([-1.0, 1.0], shape) * rng.uniform(1, 2, shape)
            * 2.0 ** rng.integers(-exp, exp + 1, shape)).astype(np.float32)


def _to_bf16(x: np.ndarray) -> np.ndarray:
    """x rounded to bf16 (torch's conversion: to nearest even), as float32."""
    import torch
    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).bfloat16().float().numpy()


def _emulated(lib, kind, A, B, C):
    D = np.full((len(A), 16, 8), np.nan, np.float32)
    for p in range(len(A)):
        if kind == "tf32":
            assert lib.emu_mma(ptr(A[p]), ptr(B[p]), ptr(C[p]), ptr(D[p])) == 0
        else:
            assert lib.emu_mma16(ptr(bf16_bits(A[p])), ptr(bf16_bits(B[p])), ptr(C[p]), ptr(D[p])) == 0
    return D


# the probe issues the kernels' own mma wrappers (common/mma_ops.h) on common/mma_frags.h's fragments
PROBE_HEADERS = ["common/mma_frags.h", "common/mma_ops.h", "common/wgmma_probe.h"]


def _on_gpu(kind, A, B, C):
    import torch
    lib = _native.load("mma_probe", ["common/mma_probe.cu"], kind="cuda", headers=PROBE_HEADERS)
    n = len(A)
    dev = {"C": torch.from_numpy(C).cuda(), "D": torch.full((n, 16, 8), float("nan"), device="cuda")}
    if kind == "tf32":
        a, b, fn = torch.from_numpy(A).cuda(), torch.from_numpy(B).cuda(), lib.probe_mma8
    else:
        a = torch.from_numpy(bf16_bits(A).view(np.int16)).cuda()
        b = torch.from_numpy(bf16_bits(B).view(np.int16)).cuda()
        fn = lib.probe_mma16
    fn.restype = ctypes.c_int
    status = fn(_P(a.data_ptr()), _P(b.data_ptr()), _P(dev["C"].data_ptr()), _P(dev["D"].data_ptr()),
                ctypes.c_int(n))
    assert status == 0, f"CUDA status {status}"
    return dev["D"].cpu().numpy()


@pytest.mark.skipif(_native.find_nvcc() is None, reason="nvcc not found")
def test_mma_probe_compiles():
    """The GPU test's probe (the kernels' mma wrappers on the fragments of common/mma_frags.h) builds for
    sm_90a with nvcc (here, without a GPU; it runs in the GPU test below)."""
    path = _native.build("mma_probe", ["common/mma_probe.cu"], kind="cuda", headers=PROBE_HEADERS)
    assert path.exists() and path.stat().st_size > 0


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["tf32", "bf16"])
def test_tensor_cores_match_the_emulated_mma(lib, kind):
    """The tensor cores' mma.sync (kernels/common/mma_probe.cu) and the emulation's model of it on
    the same matrices, fragments built from the same PTX ISA tables: on small integers both equal
    A B + C exactly (the fragment layout); a tf32 operand's low 13 bits are dropped, not rounded;
    on values of mixed magnitude the two agree to the rounding of a float32 sum of the k + 1 terms
    (the model adds the products in k order, rounding each sum; the tensor cores sum their own way),
    the bound taken from each result's own terms. The share of bit-equal results is printed."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    k = 8 if kind == "tf32" else 16
    rng = np.random.default_rng(3)
    n = 64
    A = rng.integers(-8, 9, (n, 16, k)).astype(np.float32)
    B = rng.integers(-8, 9, (n, k, 8)).astype(np.float32)
    C = rng.integers(-50, 51, (n, 16, 8)).astype(np.float32)
    gpu, emu = _on_gpu(kind, A, B, C), _emulated(lib, kind, A, B, C)
    np.testing.assert_array_equal(gpu, A @ B + C)
    np.testing.assert_array_equal(emu, gpu)
    if kind == "tf32":  # 1 + 2^-11 + 2^-12 is 1 truncated to tf32, 1 + 2^-10 rounded
        A1 = np.zeros((1, 16, 8), np.float32)
        A1[0, 3, 5] = np.float32(1 + 2.0 ** -11 + 2.0 ** -12)
        B1 = np.eye(8, dtype=np.float32)[None]
        C1 = np.zeros((1, 16, 8), np.float32)
        got = _on_gpu(kind, A1, B1, C1)
        assert got[0, 3, 5] == 1.0 and np.count_nonzero(got) == 1
    A = _mixed(rng, (n, 16, k))
    B = _mixed(rng, (n, k, 8))
    C = _mixed(rng, (n, 16, 8), exp=9)
    if kind == "bf16":
        A, B = _to_bf16(A), _to_bf16(B)
    gpu, emu = _on_gpu(kind, A, B, C), _emulated(lib, kind, A, B, C)
    opA = A if kind == "bf16" else (A.view(np.uint32) & 0xFFFFE000).view(np.float32)
    opB = B if kind == "bf16" else (B.view(np.uint32) & 0xFFFFE000).view(np.float32)
    exact = opA.astype(np.float64) @ opB.astype(np.float64) + C.astype(np.float64)
    terms = np.abs(opA.astype(np.float64)) @ np.abs(opB.astype(np.float64)) + np.abs(C.astype(np.float64))
    bound = 2 * (k + 1) * 2.0 ** -24 * terms
    assert np.all(np.abs(emu - exact) <= bound), "the model is off its own error bound"
    assert np.all(np.abs(gpu - exact) <= bound), "the tensor cores are off the model's bound"
    print(f"mma {kind}: {np.mean(gpu == emu):.4f} of {gpu.size} results bit-equal to the model; "
          f"max |gpu - model| / terms {np.max(np.abs(gpu - emu) / terms):.3e}, "
          f"max |gpu - exact| / terms {np.max(np.abs(gpu - exact) / terms):.3e}, "
          f"max |model - exact| / terms {np.max(np.abs(emu - exact) / terms):.3e}")


# ---------------------------------------------- wgmma (warpgroup MMA): the model and the GPU's

# (kind, N, swizzle, start, lbo, sbo): B's layouts a kernel would use. Without swizzle a core
# matrix is 8 rows of 16 bytes (128 bytes), the instruction's second 16 bytes of k LBO away, the
# next 8 rows SBO away: k pieces adjacent (LBO 128, SBO 256) or far apart (LBO N / 8 * 128, SBO
# 128). With a W-byte swizzle a row is W bytes, 8 rows SBO = 8 W apart; start 32 j is the j-th
# k step of the row (as a kernel walks K within a swizzled tile).
WG_LAYOUTS = [
    ("tf32", 8, 0, 0, 128, 256),
    ("tf32", 32, 0, 0, 512, 128),
    ("tf32", 16, 32, 0, 0, 256),
    ("tf32", 32, 64, 32, 0, 512),
    ("tf32", 64, 128, 0, 0, 1024),
    ("tf32", 64, 128, 96, 0, 1024),
    ("bf16", 8, 0, 0, 128, 256),
    ("bf16", 32, 0, 0, 512, 128),
    ("bf16", 16, 32, 0, 0, 256),
    ("bf16", 32, 64, 32, 0, 512),
    ("bf16", 64, 128, 64, 0, 1024),
    # bf16 with B MN-major (the transpose flag; "bf16t"): n contiguous. No swizzle: core matrices
    # of 8 rows of k x 16 bytes of n, pieces of n SBO apart, groups of k LBO apart; a W-byte
    # swizzle: rows of k W bytes of n, atoms of n LBO apart, groups of 8 rows of k SBO apart. The
    # last two: the same tile as the K-major ("bf16", 64, 128, ...) one of a 64 x 128 key tile read
    # transposed (a start 2048 on: its second k step), which would spare a kernel a transposed copy.
    ("bf16t", 16, 0, 0, 256, 128),
    ("bf16t", 32, 32, 0, 512, 256),
    ("bf16t", 64, 64, 0, 1024, 512),
    ("bf16t", 64, 128, 0, 0, 1024),
    ("bf16t", 64, 128, 2048, 0, 1024),
]
WG_IMAGE = 16384


def wg_place_b(B: np.ndarray, kind: str, swizzle: int, start: int, lbo: int, sbo: int) -> np.ndarray:
    """The shared-memory image (uint32 words, NaN elsewhere) holding B (K x N) as a K-major
    wgmma operand, per the PTX ISA's canonical layouts (written here from the ISA, apart from the
    model's code): element (k, n) in row n; 16-byte pieces of k; rows in groups of 8, SBO apart;
    no swizzle: a row 16 bytes, the second piece LBO away; a W-byte swizzle: a row W bytes, the
    16-byte unit index XORed with the row index within its 8 (bits 4.. with bits 7..)."""
    e = 4 if kind == "tf32" else 2
    mn = kind == "bf16t"
    bits = B.astype(np.float32).view(np.uint32) if kind == "tf32" else bf16_bits(B)
    img = np.full(WG_IMAGE // e, 0x7FC00000 if e == 4 else 0x7FC0, np.uint32 if e == 4 else np.uint16)
    per = 16 // e
    K, N = B.shape
    for k in range(K):
        for n in range(N):
            if mn:  # n contiguous, rows of k
                piece, within = divmod(n, per)
                if swizzle == 0:
                    addr = start + (k % 8) * 16 + piece * sbo + (k // 8) * lbo + within * e
                else:
                    atom, unit16 = divmod(piece, swizzle // 16)
                    addr = start + (k % 8) * swizzle + unit16 * 16 + atom * lbo + (k // 8) * sbo + within * e
            else:
                piece, within = divmod(k, per)
                if swizzle == 0:
                    addr = start + (n // 8) * sbo + (n % 8) * 16 + piece * lbo + within * e
                else:
                    addr = start + (n // 8) * sbo + (n % 8) * swizzle + piece * 16 + within * e
            if swizzle:
                unit = (addr >> 4) & 7
                row = (addr >> 7) & (swizzle // 16 - 1)
                addr = (addr & ~0x70) | ((unit ^ row) << 4)
            assert addr % e == 0 and addr + e <= WG_IMAGE
            img[addr // e] = bits[k, n]
    return img.view(np.uint32)


def wg_a_frags(A: np.ndarray, kind: str) -> np.ndarray:
    """A (64 x K) as the warpgroup's registers, [128, 4]: warp w's rows 16 w .. in mma.sync's
    m16n8k8 tf32 / m16n8k16 bf16 A fragment."""
    out = np.zeros((128, 4), np.uint32)
    for t in range(128):
        w, g, tq = t // 32, (t % 32) // 4, t % 4
        r0 = 16 * w + g
        if kind == "tf32":
            u = A.astype(np.float32).view(np.uint32)
            out[t] = [u[r0, tq], u[r0 + 8, tq], u[r0, tq + 4], u[r0 + 8, tq + 4]]
        else:
            b = bf16_bits(A).astype(np.uint32)
            pair = [b[r, c] | (b[r, c + 1] << 16) for r, c in
                    ((r0, 2 * tq), (r0 + 8, 2 * tq), (r0, 2 * tq + 8), (r0 + 8, 2 * tq + 8))]
            out[t] = pair
    return out


def wg_d_index(N: int):
    """(rows, cols) of D's registers [128, N / 2] (register i of lane (g, t) of warp w: row
    16 w + g + 8 ((i / 2) % 2), column 8 (i / 4) + 2 t + i % 2)."""
    t, i = np.meshgrid(np.arange(128), np.arange(N // 2), indexing="ij")
    w, g, tq = t // 32, (t % 32) // 4, t % 4
    return 16 * w + g + 8 * ((i // 2) % 2), 8 * (i // 4) + 2 * tq + i % 2


def wg_regs(D: np.ndarray) -> np.ndarray:
    rows, cols = wg_d_index(D.shape[1])
    return np.ascontiguousarray(D[rows, cols], np.float32)


def wg_matrix(regs: np.ndarray, N: int) -> np.ndarray:
    rows, cols = wg_d_index(N)
    D = np.full((64, N), np.nan, np.float32)
    D[rows, cols] = regs
    return D


def _wg_run(fn, layout, A, B, C, scale_d=1):
    kind, N, swizzle, start, lbo, sbo = layout
    img = wg_place_b(B, kind, swizzle, start, lbo, sbo)
    a = wg_a_frags(A, kind)
    c = wg_regs(C)
    return fn(N, {"tf32": 0, "bf16": 1, "bf16t": 2}[kind], img, start, lbo, sbo, swizzle, a, c, scale_d)


def _wg_emu(lib):
    lib.emu_wgmma.restype = ctypes.c_int

    def run(N, kind, img, start, lbo, sbo, swizzle, a, c, scale_d):
        d = np.full((128, N // 2), np.nan, np.float32)
        st = lib.emu_wgmma(N, kind, ptr(img), len(img), start, lbo, sbo, swizzle, ptr(a), ptr(c), ptr(d), scale_d)
        assert st == 0, (st, lib.emu_last_failure())
        return wg_matrix(d, N)
    return run


def _wg_inputs(rng, kind, N, mixed=False):
    k = 8 if kind == "tf32" else 16
    if not mixed:
        return (rng.integers(-8, 9, (64, k)).astype(np.float32), rng.integers(-8, 9, (k, N)).astype(np.float32),
                rng.integers(-50, 51, (64, N)).astype(np.float32))
    A, B, C = _mixed(rng, (64, k)), _mixed(rng, (k, N)), _mixed(rng, (64, N), exp=9)
    if kind != "tf32":
        A, B = _to_bf16(A), _to_bf16(B)
    return A, B, C


def _operands(kind, X):
    return X if kind != "tf32" else (X.view(np.uint32) & 0xFFFFE000).view(np.float32)


@pytest.mark.parametrize("layout", WG_LAYOUTS, ids=lambda x: "-".join(map(str, x)))
def test_wgmma_model_reads_the_ptx_layouts(lib, layout):
    """The emulation's wgmma (A from registers, B by shared-memory descriptor, K-major, no / 32 /
    64 / 128-byte swizzle, a start inside the swizzle's row) equals A B + C on small integers, with
    B placed by the ISA's canonical layout written independently here and NaN everywhere else (a
    misread element shows); scale_d 0 drops C; on mixed magnitudes it is its documented arithmetic:
    the tf32 (truncated) or bf16 products added to C in k order, rounded to float32 at each add."""
    kind, N = layout[0], layout[1]
    emu = _wg_emu(lib)
    rng = np.random.default_rng(N + layout[2] + layout[3])
    A, B, C = _wg_inputs(rng, kind, N)
    np.testing.assert_array_equal(_wg_run(emu, layout, A, B, C), A @ B + C)
    np.testing.assert_array_equal(_wg_run(emu, layout, A, B, C, scale_d=0), A @ B)
    A, B, C = _wg_inputs(rng, kind, N, mixed=True)
    opA, opB = _operands(kind, A), _operands(kind, B)
    want = C.copy()
    for k in range(A.shape[1]):
        want = (want + np.outer(opA[:, k], opB[k, :])).astype(np.float32)
    np.testing.assert_array_equal(_wg_run(emu, layout, A, B, C), want)


def test_wgmma_mn_major_tile_is_the_k_major_tile_transposed():
    """By the ISA's canonical layouts, a 64 x 64 bf16 tile stored K-major for one product (rows
    c, k contiguous, 128-byte swizzle, SBO 1024) is, byte for byte, the MN-major operand of the
    product that reads it transposed (rows of k = c, n contiguous, SBO 1024): a kernel's key tile
    can serve S K^T and the update K^T U without a transposed copy (once the tensor cores agree:
    the "bf16t" layouts of the GPU test)."""
    rng = np.random.default_rng(9)
    Kmat = rng.integers(-8, 9, (64, 64)).astype(np.float32)  # [c, kd]
    kmajor = wg_place_b(Kmat.T, "bf16", 128, 0, 0, 1024)  # B(k = kd, n = c)
    mnmajor = wg_place_b(Kmat, "bf16t", 128, 0, 0, 1024)  # B(k = c, n = kd)
    np.testing.assert_array_equal(kmajor.view(np.uint16)[:4096], mnmajor.view(np.uint16)[:4096])


def test_wgmma_model_is_asynchronous(lib):
    """As on the GPU, a wgmma's accumulators change at the wgmma.wait_group that covers it: read
    before it they hold their old values (a kernel that reads them early shows it); a wgmma issued
    and never waited for fails the launch, naming why."""
    lib.emu_wgmma_async.restype = ctypes.c_int
    out = np.full(256, np.nan, np.float32)
    assert lib.emu_wgmma_async(ptr(out), 0) == 0
    assert np.all(out[:128] == 5.0) and np.all(out[128:] == 13.0)
    assert lib.emu_wgmma_async(ptr(out), 1) == 719
    assert b"never waited" in lib.emu_last_failure()


def test_wgmma_probe_builds_for_sm90a():
    """The GPU probe's wgmma (mma_ops.h's wrappers for N = 8..64, tf32 and bf16) is valid PTX for
    sm_90a: nvcc builds it here (without a GPU)."""
    if _native.find_nvcc() is None:
        pytest.skip("nvcc not found")
    path = _native.build("mma_probe", ["common/mma_probe.cu"], kind="cuda", headers=PROBE_HEADERS)
    assert path.exists() and path.stat().st_size > 0


def _wg_gpu():
    import torch
    lib = _native.load("mma_probe", ["common/mma_probe.cu"], kind="cuda", headers=PROBE_HEADERS)
    lib.probe_wgmma.restype = ctypes.c_int

    def run(N, kind, img, start, lbo, sbo, swizzle, a, c, scale_d):
        dev = [torch.from_numpy(x.view(np.int32) if x.dtype == np.uint32 else x).cuda() for x in (img, a, c)]
        d = torch.full((128, N // 2), float("nan"), device="cuda")
        st = lib.probe_wgmma(N, kind, _P(dev[0].data_ptr()), len(img), start, lbo, sbo, swizzle,
                             _P(dev[1].data_ptr()), _P(dev[2].data_ptr()), _P(d.data_ptr()), scale_d)
        assert st == 0, f"CUDA status {st}"
        return wg_matrix(d.cpu().numpy(), N)
    return run


@pytest.mark.gpu
@pytest.mark.parametrize("layout", WG_LAYOUTS, ids=lambda x: "-".join(map(str, x)))
def test_tensor_cores_match_the_emulated_wgmma(lib, layout, tmp_path):
    """The tensor cores' wgmma (common/wgmma_probe.h through mma_probe.cu) and the emulation's
    model (the same source through cuda_emu_selftest.cpp) on the same image, descriptor and
    fragments: on small integers both equal A B + C exactly (the layouts: descriptor fields,
    swizzle, fragments), scale_d 0 drops C; on mixed magnitudes both within the rounding of a
    float32 sum of the k + 1 terms, the bound from each result's own terms; the share of bit-equal
    results is printed. With WB_PROBE_DUMP set, the GPU's results go there (for a layout that
    disagrees, to read what it did)."""
    import os
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    kind, N = layout[0], layout[1]
    gpu_run, emu = _wg_gpu(), _wg_emu(lib)
    rng = np.random.default_rng(N + layout[2] + layout[3])
    A, B, C = _wg_inputs(rng, kind, N)
    gpu = _wg_run(gpu_run, layout, A, B, C)
    if os.environ.get("WB_PROBE_DUMP"):
        name = "-".join(map(str, layout))
        np.savez(os.path.join(os.environ["WB_PROBE_DUMP"], f"wgmma-{name}.npz"), A=A, B=B, C=C, gpu=gpu)
    np.testing.assert_array_equal(gpu, A @ B + C)
    np.testing.assert_array_equal(_wg_run(emu, layout, A, B, C), gpu)
    np.testing.assert_array_equal(_wg_run(gpu_run, layout, A, B, C, scale_d=0), A @ B)
    A, B, C = _wg_inputs(rng, kind, N, mixed=True)
    k = A.shape[1]
    gpu, model = _wg_run(gpu_run, layout, A, B, C), _wg_run(emu, layout, A, B, C)
    opA, opB = _operands(kind, A).astype(np.float64), _operands(kind, B).astype(np.float64)
    exact = opA @ opB + C
    terms = np.abs(opA) @ np.abs(opB) + np.abs(C.astype(np.float64))
    bound = 2 * (k + 1) * 2.0 ** -24 * terms
    assert np.all(np.abs(model - exact) <= bound), "the model is off its own error bound"
    assert np.all(np.abs(gpu - exact) <= bound), "the tensor cores are off the model's bound"
    print(f"wgmma {layout}: {np.mean(gpu == model):.4f} of {gpu.size} bit-equal to the model; "
          f"max |gpu - exact| / terms {np.max(np.abs(gpu - exact) / terms):.3e}, "
          f"max |model - exact| / terms {np.max(np.abs(model - exact) / terms):.3e}")
