"""FP64 truth of split-K GEMM, with the storage rounding of the partials emulated exactly.

Each K slice's partial ``x[:, slice] @ w[:, slice]^T`` is computed exactly in fp64 (products of
fp32/bf16/fp16 inputs and their sums of a few thousand terms are exact to far below fp32's
resolution), rounded once, to nearest even, to ``partial_dtype`` (``"fp64"``: not rounded), and
the partials are summed in fp64. ``partial_dtype=None`` gives the exact product. ``out_dtype`` and
``order`` do not change the fp64 result; they are accepted so that the signature is shared.
"""

from __future__ import annotations

import torch

from workbench.numerics.dtypes import round_to

OPS = ("splitk_matmul",)
# float64 with the partial rounding emulated: the truth, whatever the policy's other knobs
KNOBS = None

__all__ = ["splitk_matmul", "splitk_partials", "slice_bounds", "is_available"]


def is_available() -> tuple[bool, str]:
    return True, "plain torch float64"


def slice_bounds(K: int, splits: int) -> list[tuple[int, int]]:
    """The K slices: ``ceil(K / splits)`` columns each, the last one shorter (none empty)."""
    c = -(-K // splits)
    return [(s * c, min(K, (s + 1) * c)) for s in range(splits) if s * c < K]


def splitk_partials(x, w, *, splits=1, partial_dtype=None):
    """Exact partials ``[S, M, N]`` fp64, rounded to ``partial_dtype`` when given."""
    xd, wd = x.double(), w.double()
    parts = torch.stack([xd[:, a:b] @ wd[:, a:b].T for a, b in slice_bounds(x.shape[1], splits)])
    if partial_dtype is not None and partial_dtype != "fp64":
        parts = torch.from_numpy(round_to(parts, partial_dtype)).to(parts.device)
    return parts


def splitk_matmul(x, w, *, splits=None, partial_dtype=None, order=None, out_dtype=None, policy=None):
    return splitk_partials(x, w, splits=splits or 1, partial_dtype=partial_dtype).sum(0)
