"""Split-K GEMM in plain torch: each K slice summed in fp32 in k order, partials stored in
``partial_dtype``, reduced in fp32 sequentially or as a pairwise tree, then rounded to ``out_dtype``.

The slice sum is ``acc = acc + x[:, k] * w[:, k]`` for k = k0, k0+1, ... with one rounding per
multiply and per add (elementwise torch ops, which IEEE arithmetic defines bit for bit), not a
``torch.matmul``: a BLAS chooses its own blocking, vector width, FMA use and, for a memory-mapped
operand, a code path by the pointer's alignment, so its bits differ between CPUs (AVX2 and
AVX-512, Intel and AMD) and between a captured tensor and a copy of it. This order gives the same
bits on every CPU and GPU, and the same bits as the ext CPU build (``kernels/gemm/gemm_cpu.cpp``,
compiled with ``-ffp-contract=off``), at the cost of K elementwise launches per slice.
"""

from __future__ import annotations

import torch

from workbench.kernels.gemm.oracle import slice_bounds
from workbench.numerics.dtypes import torch_dtype

OPS = ("splitk_matmul",)
# every value of the split-K knobs (torch has no native CUDA path choice)
KNOBS = {"splitk": None, "partial_dtype": None, "reduction_order": None}

__all__ = ["splitk_matmul", "splitk_partials", "slice_product", "reduce_partials", "is_available"]


def is_available() -> tuple[bool, str]:
    return True, "plain torch"


def slice_product(x, w):
    """``x @ w^T`` in fp32, summed in k order with one rounding per multiply and per add.

    x: ``[M, L]``, w: ``[N, L]`` (any float dtype; read as fp32). Returns ``[M, N]`` fp32.
    """
    xf = x.float()
    wt = w.float().t().contiguous()  # row k of wt is column k of w: one contiguous [N] read
    M, L = xf.shape
    acc = torch.zeros(M, wt.shape[1], dtype=torch.float32, device=xf.device)
    prod = torch.empty_like(acc)
    for k in range(L):
        torch.mul(xf[:, k:k + 1], wt[k], out=prod)
        acc.add_(prod)
    return acc


def splitk_partials(x, w, *, splits=1, partial_dtype="fp32"):
    """Partials ``[S, M, N]`` in ``partial_dtype``: each slice a :func:`slice_product`."""
    parts = [slice_product(x[:, a:b], w[:, a:b]) for a, b in slice_bounds(x.shape[1], splits)]
    return torch.stack(parts).to(torch_dtype(partial_dtype))


def reduce_partials(parts, order="sequential"):
    """fp32 sum over the first dim: left to right, or pairwise ((p0+p1)+(p2+p3))+..."""
    terms = [p.float() for p in parts]
    if order == "sequential":
        acc = terms[0]
        for t in terms[1:]:
            acc = acc + t
        return acc
    while len(terms) > 1:
        nxt = [terms[i] + terms[i + 1] for i in range(0, len(terms) - 1, 2)]
        if len(terms) % 2:
            nxt.append(terms[-1])
        terms = nxt
    return terms[0]


def splitk_matmul(x, w, *, splits=None, partial_dtype=None, order=None, out_dtype=None, policy=None):
    if splits == 1 and partial_dtype == "fp32":
        # one slice, fp32 partial: the slice sum itself (no extra rounding, no reduction)
        y = slice_product(x, w)
    else:
        y = reduce_partials(splitk_partials(x, w, splits=splits, partial_dtype=partial_dtype), order)
    return y.to(torch_dtype(out_dtype))
