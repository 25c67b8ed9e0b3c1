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
                       headers=["common/cuda_emu.h", "common/mma_frags.h", "common/mma_ops.h"])
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
PROBE_HEADERS = ["common/mma_frags.h", "common/mma_ops.h"]


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
