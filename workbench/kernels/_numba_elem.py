"""The numba twin of ``kernels/common/wb_elem.h``: device functions every numba.cuda kernel family
shares (exact loads of fp32 / bf16 buffers, the round-to-nearest-even to bf16 / fp16, exp2 and
log2), the simulator switch, the stream, and the dtype codes of the native ABI
(:data:`workbench.numerics.dtypes.NATIVE_CODES`)."""

from __future__ import annotations

import numpy as np
import torch
from numba import cuda, float32, int16, int32
from numba.cuda import libdevice

from workbench.numerics.dtypes import NATIVE_CODES

__all__ = ["NATIVE_CODES", "is_available", "_simulated", "_stream", "_ld", "_st", "_bf16_bits", "_round", "_exp2",
           "_log2"]


def is_available() -> tuple[bool, str]:
    try:
        if cuda.is_available():
            return True, "numba.cuda with a CUDA device" + (" (simulator)" if _simulated() else "")
        return False, "numba.cuda finds no CUDA GPU (numba.cuda.is_available() is False)"
    except Exception as e:  # pragma: no cover - broken driver
        return False, f"numba.cuda failed: {e}"


def _simulated() -> bool:
    from numba import config
    return bool(config.ENABLE_CUDASIM)


if _simulated():  # the simulator has no libdevice: the same operations through numpy (exact too)
    @cuda.jit(device=True)
    def _i2f(i):
        return np.array([i], dtype=np.int64).astype(np.uint32).view(np.float32)[0]

    @cuda.jit(device=True)
    def _f2i(x):
        return int(np.array([x], dtype=np.float32).view(np.int32)[0])

    @cuda.jit(device=True)
    def _exp2(x):
        return np.float32(np.exp2(np.float32(x)))

    @cuda.jit(device=True)
    def _log2(x):
        return np.float32(np.log2(np.float32(x)))
else:
    _i2f, _f2i, _exp2, _log2 = libdevice.int_as_float, libdevice.float_as_int, libdevice.exp2f, libdevice.log2f


@cuda.jit(device=True, inline=True)
def _ld(a, i, dt):
    if dt == 1:
        return _i2f(int32(a[i]) << 16)
    return float32(a[i])


@cuda.jit(device=True, inline=True)
def _bf16_bits(x):
    """The bf16 bit pattern (as a signed 16-bit value) of fp32 x rounded to nearest even; NaN
    stays NaN, overflow goes to inf (wb_elem.h's wb_store)."""
    u = _f2i(x)
    a = u & 0x7fffffff
    if a > 0x7f800000:
        r = 0x7fc0
    else:
        r = (a + 0x7fff + ((a >> 16) & 1)) >> 16
    if u < 0:
        r = r | 0x8000
    return int16(r - 0x10000 if r >= 0x8000 else r)


@cuda.jit(device=True, inline=True)
def _st(a, i, x, dt):
    """Store fp32 x as element i of a float32 (dt 0), bf16-as-int16 (1) or float16 (2) array,
    rounded once to nearest even."""
    if dt == 1:
        a[i] = _bf16_bits(x)
    else:
        a[i] = x


@cuda.jit(device=True, inline=True)
def _round(x, dt):
    """Round fp32 x once, to nearest even, to bf16 (dt 1) or fp16 (dt 2); x >= 0 and finite."""
    if dt == 0 or x == float32(0.0):
        return x
    mant = 7 if dt == 1 else 10
    emin = -126 if dt == 1 else -14
    u = _f2i(x)
    e = ((u >> 23) & 255) - 127
    if e < emin:  # target subnormal: adding 2^(emin - mant + 23) rounds to its fixed quantum
        c = _i2f(int32((emin - mant + 23 + 127) << 23))
        return float32(float32(x + c) - c)
    drop = 23 - mant
    lsb = (u >> drop) & 1
    u = (u + ((1 << (drop - 1)) - 1) + lsb) & ~((1 << drop) - 1)
    return _i2f(int32(u))


def _stream():
    if _simulated():
        return 0
    return cuda.external_stream(torch.cuda.current_stream().cuda_stream)
