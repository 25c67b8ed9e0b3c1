"""Public split-K GEMM: check the arguments, resolve defaults from the policy, dispatch."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.errors import KernelArgumentError
from workbench.kernels.registry import call, register_knobs
from workbench.numerics.dtypes import canonical
from workbench.numerics.policy import resolve_policy

__all__ = ["splitk_matmul", "batch_invariance", "BatchInvariance"]

# the policy knobs split-K GEMM reads; each backend's KNOBS says which values it honours
register_knobs("gemm", ("splitk", "partial_dtype", "reduction_order", "cuda_path"))
_PARTIALS = ("fp32", "bf16", "fp16")
_OUTS = ("fp32", "bf16", "fp16")


def _choice(name, value, choices):
    if value not in choices:
        raise KernelArgumentError(f"{name} must be one of {list(choices)}, got {value!r}", key=name,
                                  fix=f"pass {name}= one of {list(choices)}")


def splitk_matmul(x, w, *, splits=None, partial_dtype=None, order=None, out_dtype=None, policy=None,
                  backend="torch"):
    """``y = x @ w.T`` with K cut into ``splits`` slices (the nn.Linear layout).

    Each slice (``ceil(K / splits)`` columns, the last shorter) is accumulated in fp32, its partial
    stored in ``partial_dtype``, and the partials are summed in fp32 in ``order``: ``"sequential"``
    (``((p0 + p1) + p2) + ...``) or ``"tree"`` (pairwise, ``(p0 + p1) + (p2 + p3)``, an odd last
    one carried up). The sum is rounded once to ``out_dtype``.

    Parameters
    ----------
    x: ``[M, K]`` fp32/bf16/fp16 activations (M = tokens, e.g. 1..16)
    w: ``[N, K]`` weight in x's dtype (``nn.Linear.weight``; N = vocab 151936 for lm_head)
    splits: number of K slices (default ``policy.splitk``)
    partial_dtype: "fp32", "bf16" or "fp16" (default ``policy.partial_dtype``)
    order: "sequential" or "tree" (default ``policy.reduction_order``)
    out_dtype: "fp32", "bf16" or "fp16" (default x's dtype)
    backend: "torch", "oracle" (fp64, partial rounding emulated, returns fp64), "numba", "ext"

    Returns
    -------
    ``[M, N]`` in ``out_dtype``

    Example
    -------
    >>> x, w = torch.randn(2, 64), torch.randn(8, 64)
    >>> y = splitk_matmul(x, w, splits=4, partial_dtype="bf16")
    >>> y.shape, y.dtype
    (torch.Size([2, 8]), torch.float32)
    """
    policy = resolve_policy(policy)
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise KernelArgumentError(
                f"{name} must be an fp32, bf16 or fp16 tensor, got {getattr(t, 'dtype', type(t).__name__)}",
                key=name, fix=f"convert {name} with .to(torch.bfloat16)")
        if t.dim() != 2:
            raise KernelArgumentError(f"{name} must be 2-D ({'[M, K]' if name == 'x' else '[N, K]'}), got shape "
                                      f"{tuple(t.shape)}", key=name, fix="flatten leading dims into M")
    if w.shape[1] != x.shape[1]:
        raise KernelArgumentError(f"w must be [N, K={x.shape[1]}] (nn.Linear layout, y = x w^T), got "
                                  f"{tuple(w.shape)}", key="w", fix="pass the weight as stored by nn.Linear, not transposed")
    if w.dtype != x.dtype or w.device != x.device:
        raise KernelArgumentError(f"w must match x's dtype/device ({x.dtype}, {x.device}), got ({w.dtype}, {w.device})",
                                  key="w", fix="materialize x and w in one dtype on one device")
    splits = policy.splitk if splits is None else splits
    if not isinstance(splits, int) or isinstance(splits, bool) or not 1 <= splits <= x.shape[1]:
        raise KernelArgumentError(f"splits must be an int in [1, K={x.shape[1]}], got {splits!r}", key="splits",
                                  fix="pass splits=1..K")
    partial_dtype = policy.partial_dtype if partial_dtype is None else canonical(partial_dtype)
    _choice("partial_dtype", partial_dtype, _PARTIALS)
    order = policy.reduction_order if order is None else order
    _choice("order", order, ("sequential", "tree"))
    out_dtype = canonical(x.dtype) if out_dtype is None else canonical(out_dtype)
    _choice("out_dtype", out_dtype, _OUTS)
    # the explicit arguments are the policy's knobs for this call: checked with it, once
    return call("gemm", backend, "splitk_matmul", x, w, splits=splits, partial_dtype=partial_dtype, order=order,
                out_dtype=out_dtype, policy=policy,
                knobs={"splitk": splits, "partial_dtype": partial_dtype, "reduction_order": order})


@dataclass(frozen=True)
class BatchInvariance:
    """Per-row result of :func:`batch_invariance`.

    rows: bool per row, True when the row computed alone equals the row in the batch bitwise
    max_abs: per row, the largest absolute difference (0.0 where equal)
    """

    rows: tuple[bool, ...]
    max_abs: tuple[float, ...]

    @property
    def invariant(self) -> bool:
        return all(self.rows)

    def __str__(self) -> str:
        bad = [i for i, r in enumerate(self.rows) if not r]
        return (f"batch invariant: {self.invariant} ({len(self.rows) - len(bad)}/{len(self.rows)} rows bitwise "
                f"equal{'; differ: ' + str(bad[:16]) if bad else ''})")


def batch_invariance(fn, x, *args, **kwargs) -> BatchInvariance:
    """Run ``fn(x, ...)`` on the whole batch and on every row alone; compare the rows bitwise.

    Parameters
    ----------
    fn: callable taking ``x`` ``[M, ...]`` first and returning ``[M, ...]``
    x: the batch; ``args``/``kwargs`` are passed to every call

    Example
    -------
    >>> w = torch.randn(8, 64)
    >>> report = batch_invariance(lambda x: splitk_matmul(x, w, splits=2), torch.randn(4, 64))
    >>> len(report.rows)          # report.invariant: are all rows bitwise equal?
    4
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[0] < 1:
        raise KernelArgumentError("x must be a tensor with a batch dim of at least one row", key="x",
                                  fix="pass x of shape [M, ...] with M >= 1")
    full = fn(x, *args, **kwargs)
    rows, diffs = [], []
    for i in range(x.shape[0]):
        alone = fn(x[i:i + 1], *args, **kwargs)[0]
        same = bool(torch.equal(alone, full[i]))
        rows.append(same)
        diffs.append(0.0 if same else float((alone.double() - full[i].double()).abs().max()))
    return BatchInvariance(tuple(rows), tuple(diffs))
