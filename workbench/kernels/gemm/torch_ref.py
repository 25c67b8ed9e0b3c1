"""Split-K GEMM in plain torch: fp32 slice products, partials stored in ``partial_dtype``,
reduced in fp32 sequentially or as a pairwise tree, then rounded to ``out_dtype``."""

from __future__ import annotations

import torch

from workbench.kernels.gemm.oracle import slice_bounds
from workbench.numerics.dtypes import torch_dtype

__all__ = ["splitk_matmul", "splitk_partials", "reduce_partials", "is_available"]


def is_available() -> tuple[bool, str]:
    return True, "plain torch"


def splitk_partials(x, w, *, splits=1, partial_dtype="fp32"):
    """Partials ``[S, M, N]`` in ``partial_dtype``: each slice is an fp32 ``torch.matmul``."""
    xf, wf = x.float(), w.float()
    parts = [torch.matmul(xf[:, a:b], wf[:, a:b].t()) for a, b in slice_bounds(x.shape[1], splits)]
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
        # one slice, fp32 partial: exactly a plain fp32 matmul (no extra rounding, no reduction)
        y = torch.matmul(x.float(), w.float().t())
    else:
        y = reduce_partials(splitk_partials(x, w, splits=splits, partial_dtype=partial_dtype), order)
    return y.to(torch_dtype(out_dtype))
