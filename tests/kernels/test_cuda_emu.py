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
                       headers=["common/cuda_emu.h"])
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
