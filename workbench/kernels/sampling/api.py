"""Logits to tokens, with every tie and order rule stated: greedy argmax, stateless inverse-CDF
draws, and fp64 softmax / log-softmax for analysis."""

from __future__ import annotations

import torch

from workbench.errors import KernelArgumentError

__all__ = ["greedy", "stateless_draw", "draw_intervals", "softmax", "log_softmax"]
KNOBS = None  # the numerics policy does not apply: fixed rules, fp64 softmax


def _logits(name, t):
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 1 or t.shape[-1] < 1:
        raise KernelArgumentError(f"{name} must be a float tensor [..., V] with V >= 1, got "
                                  f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}",
                                  key=name, fix=f"pass {name} as a float tensor whose last dim is the vocabulary")
    if bool(torch.isnan(t).any()):
        raise KernelArgumentError(f"{name} must not hold NaN (no token is the maximum of NaN)", key=name,
                                  fix="find the op that produced NaN upstream")


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Index of the largest logit; on a tie the FIRST (lowest) index wins.

    The comparison is on the values as given (bf16 logits compare as bf16): two fp64 logits that
    round to the same bf16 value tie, and the lower token id is chosen.

    Parameters
    ----------
    logits: ``[..., V]`` any float dtype (no NaN)

    Returns
    -------
    ``[...]`` int64 token ids

    Example
    -------
    >>> greedy(torch.tensor([11.11763134, 11.14099662], dtype=torch.float64).bfloat16())
    tensor(0)
    """
    _logits("logits", logits)
    V = logits.shape[-1]
    is_max = logits == logits.amax(-1, keepdim=True)
    ids = torch.arange(V, device=logits.device).expand_as(is_max)
    return torch.where(is_max, ids, torch.full_like(ids, V)).amin(-1)


def _order(probs, order):
    V = probs.shape[-1]
    if isinstance(order, torch.Tensor):
        perm = order.to(torch.int64)
        if perm.shape[-1] != V:
            raise KernelArgumentError(f"order must list all V={V} tokens, got {tuple(perm.shape)}", key="order",
                                      fix="pass a permutation of range(V)")
        return perm.expand(probs.shape)
    if order == "index":
        return torch.arange(V, device=probs.device).expand(probs.shape)
    if order == "descending":
        return torch.sort(-probs.double(), dim=-1, stable=True).indices  # ties: lower id first
    raise KernelArgumentError(f"order must be 'index', 'descending' or a permutation tensor, got {order!r}",
                              key="order", fix="pass order='index'")


def _probs(probs):
    if not isinstance(probs, torch.Tensor) or not probs.is_floating_point() or probs.dim() < 1:
        raise KernelArgumentError(f"probs must be a float tensor [..., V], got {type(probs).__name__}",
                                  key="probs", fix="pass softmax(logits)")
    if bool((probs < 0).any()) or bool(torch.isnan(probs).any()) or bool((probs.sum(-1) <= 0).any()):
        raise KernelArgumentError("probs must be >= 0 with a positive sum per row", key="probs",
                                  fix="pass softmax(logits)")


def draw_intervals(probs: torch.Tensor, *, order="index") -> torch.Tensor:
    """``[..., V, 2]`` fp64: token t is drawn exactly when ``lo <= u < hi`` (``[lo, hi)``).

    Example
    -------
    >>> draw_intervals(torch.tensor([0.25, 0.75]))[1].tolist()
    [0.25, 1.0]
    """
    _probs(probs)
    perm = _order(probs, order)
    p = probs.double().gather(-1, perm)
    c = torch.cumsum(p, -1)
    c = c / c[..., -1:]
    lo_sorted = torch.cat([torch.zeros_like(c[..., :1]), c[..., :-1]], -1)
    out = torch.empty(*probs.shape, 2, dtype=torch.float64, device=probs.device)
    out[..., 0].scatter_(-1, perm, lo_sorted)
    out[..., 1].scatter_(-1, perm, c)
    return out


def stateless_draw(probs: torch.Tensor, u, *, order="index") -> torch.Tensor:
    """Inverse-CDF sample for a given uniform draw ``u`` in [0, 1).

    The cumulative sum runs in fp64 over the tokens in ``order`` (``"index"``: ascending token id;
    ``"descending"``: by probability, ties to the lower id; or a permutation tensor ``[V]``),
    normalized by the total; the token chosen is the first whose cumulative sum exceeds ``u``
    (zero-probability tokens are never chosen).

    Parameters
    ----------
    probs: ``[..., V]`` non-negative (need not sum to one); u: float or ``[...]`` in [0, 1)

    Returns
    -------
    ``[...]`` int64 token ids

    Example
    -------
    >>> p = torch.tensor([0.760651, 0.239349])   # token 0 = EOS
    >>> stateless_draw(p, 0.8).item(), stateless_draw(torch.tensor([0.839734, 0.160266]), 0.8).item()
    (1, 0)
    """
    _probs(probs)
    u = torch.as_tensor(u, dtype=torch.float64, device=probs.device)
    if bool(((u < 0) | (u >= 1)).any()):
        raise KernelArgumentError(f"u must be in [0, 1), got {u.tolist()}", key="u", fix="pass u = uniform draw in [0, 1)")
    perm = _order(probs, order)
    p = probs.double().gather(-1, perm)
    c = torch.cumsum(p, -1)
    c = c / c[..., -1:]
    u = u.expand(probs.shape[:-1])[..., None]
    pos = torch.searchsorted(c.contiguous(), u.contiguous(), right=True).clamp(max=probs.shape[-1] - 1)
    return perm.gather(-1, pos).squeeze(-1)


def softmax(logits: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim, computed in fp64 (returns fp64)."""
    _logits("logits", logits)
    return torch.softmax(logits.double(), -1)


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax (natural log, nats) over the last dim in fp64 (returns fp64)."""
    _logits("logits", logits)
    return torch.log_softmax(logits.double(), -1)
