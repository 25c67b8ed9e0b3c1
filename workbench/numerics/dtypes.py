"""Floating-point formats, exact round-to-nearest-even emulation and dtype names.

torch rounds float64 -> bfloat16 through float32 (two roundings), which can differ from a single
correct rounding; analyses of ties need the single rounding, so :func:`round_to` does it exactly
on float64 values with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from workbench.errors import KernelArgumentError

__all__ = [
    "NATIVE_CODES",
    "native_code",
    "FloatFormat",
    "FORMATS",
    "canonical",
    "torch_dtype",
    "fmt",
    "round_to",
    "ulp_of",
]


@dataclass(frozen=True)
class FloatFormat:
    """An IEEE-like binary floating-point format.

    ``mantissa`` counts explicit fraction bits; ``max_normal`` is the largest finite value.
    """

    name: str
    mantissa: int
    exponent: int
    max_normal: float
    bits: int

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent - 1) - 1

    @property
    def min_normal_exp(self) -> int:
        return 1 - self.bias

    @property
    def eps(self) -> float:
        return 2.0 ** -self.mantissa


FORMATS: dict[str, FloatFormat] = {
    "fp64": FloatFormat("fp64", 52, 11, float(np.finfo(np.float64).max), 64),
    "fp32": FloatFormat("fp32", 23, 8, float(np.finfo(np.float32).max), 32),
    "bf16": FloatFormat("bf16", 7, 8, float(torch.finfo(torch.bfloat16).max), 16),
    "fp16": FloatFormat("fp16", 10, 5, 65504.0, 16),
    "fp8_e4m3": FloatFormat("fp8_e4m3", 3, 4, 448.0, 8),
    "fp8_e5m2": FloatFormat("fp8_e5m2", 2, 5, 57344.0, 8),
}

_ALIASES = {
    "float64": "fp64", "double": "fp64", "f64": "fp64", "fp64": "fp64",
    "float32": "fp32", "float": "fp32", "f32": "fp32", "fp32": "fp32",
    "bfloat16": "bf16", "bf16": "bf16",
    "float16": "fp16", "half": "fp16", "f16": "fp16", "fp16": "fp16",
    "float8_e4m3fn": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "e4m3": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2", "fp8_e5m2": "fp8_e5m2", "e5m2": "fp8_e5m2",
}

_TORCH = {
    "fp64": torch.float64,
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}


# dtype codes of the native kernels' C ABI (``enum WbDtype`` of kernels/common/wb_elem.h; the
# numba kernels use the same): the one table every launcher reads
NATIVE_CODES = {"fp32": 0, "bf16": 1, "fp16": 2}


def native_code(dtype) -> int:
    """The native ABI's code of ``dtype`` (a name or torch dtype): fp32 0, bf16 1, fp16 2."""
    name = canonical(dtype)
    if name not in NATIVE_CODES:
        from workbench.errors import KernelArgumentError
        raise KernelArgumentError(f"the native kernels read and write {list(NATIVE_CODES)}, got {name}",
                                  key="dtype", fix="materialize the tensor in fp32, bf16 or fp16")
    return NATIVE_CODES[name]


def canonical(dtype) -> str:
    """Canonical short name ("fp32", "bf16", ...) of a torch/numpy dtype or a name."""
    if isinstance(dtype, torch.dtype):
        name = str(dtype).removeprefix("torch.")
    elif isinstance(dtype, np.dtype) or (isinstance(dtype, type) and issubclass(dtype, np.generic)):
        name = np.dtype(dtype).name
    else:
        name = str(dtype).lower()
    try:
        return _ALIASES[name]
    except KeyError:
        raise KernelArgumentError(
            f"unknown floating-point format {dtype!r}",
            key="dtype",
            fix=f"use one of {sorted(set(_ALIASES.values()))}",
        ) from None


def torch_dtype(dtype) -> torch.dtype:
    """torch dtype of a format name or dtype."""
    return _TORCH[canonical(dtype)]


def fmt(dtype) -> FloatFormat:
    """The :class:`FloatFormat` of a name or dtype."""
    return FORMATS[canonical(dtype)]


def _as_f64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().to("cpu", torch.float64).numpy()
    return np.asarray(x, dtype=np.float64)


def round_to(x, dtype) -> np.ndarray:
    """Round float64 values to ``dtype`` exactly once, to nearest, ties to even.

    Parameters
    ----------
    x: array-like or tensor, any float dtype (converted to float64 first, which is exact)
    dtype: target format ("bf16", "fp16", "fp32", "fp8_e4m3", ...)

    Returns
    -------
    np.ndarray float64 holding the rounded values (inf where the value overflows; fp8_e4m3 has no
    inf and saturates to NaN as the OCP format does).

    Example
    -------
    >>> round_to([11.14099662, 11.11763134], "bf16")
    array([11.125, 11.125])
    """
    f = fmt(dtype)
    v = _as_f64(x)
    if f.name == "fp64":
        return v.copy()
    out = np.array(v, dtype=np.float64, copy=True)
    finite = np.isfinite(v) & (v != 0)
    a = np.abs(v[finite])
    e = np.floor(np.log2(a))
    # log2 can be off by one near powers of two; correct it exactly.
    e = np.where(np.ldexp(1.0, e.astype(np.int64)) > a, e - 1, e)
    e = np.where(np.ldexp(1.0, (e + 1).astype(np.int64)) <= a, e + 1, e)
    e = np.maximum(e, f.min_normal_exp)  # subnormals share the smallest normal's spacing
    quantum = np.ldexp(1.0, (e - f.mantissa).astype(np.int64))
    r = np.round(a / quantum) * quantum  # a / quantum is exact (power of two), np.round is RNE
    overflow_limit = f.max_normal + (quantum * 0.5 if f.name != "fp8_e4m3" else 0.0)
    big = r > f.max_normal
    if f.name == "fp8_e4m3":
        r = np.where(big, np.nan, r)
    else:
        # ties at max_normal + half a quantum round to inf (even mantissa is the overflow side)
        r = np.where(big | (a >= overflow_limit), np.inf, r)
    out[finite] = np.copysign(r, v[finite])
    return out


def ulp_of(x, dtype) -> np.ndarray:
    """Spacing of ``dtype`` at each value of ``x`` (the size of one unit in the last place)."""
    f = fmt(dtype)
    a = np.abs(_as_f64(x))
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.where(a > 0, a, 1.0)))
    e = np.where(np.ldexp(1.0, e.astype(np.int64)) > a, e - 1, e)
    e = np.maximum(np.where(a > 0, e, f.min_normal_exp), f.min_normal_exp)
    return np.ldexp(1.0, (e - f.mantissa).astype(np.int64))
