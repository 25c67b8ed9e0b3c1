"""Sampling flips: for one shared uniform draw u, where do two probability vectors sample
different tokens?

Semantics are those of :func:`workbench.kernels.sampling.stateless_draw`: the fp64 cumulative sum
over the tokens in ``order``, normalized by its total; token t is drawn exactly when
``lo_t <= u < hi_t`` (its interval from :func:`workbench.kernels.sampling.draw_intervals`).
Both arms' intervals tile [0, 1); merging their two sets of breakpoints (O(V log V)) splits [0, 1)
into segments on which both arms' tokens are constant, and the segments where they differ are the
flip intervals. Their total width is the probability that a stateless sampler with the same seed
gives different tokens.
"""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from workbench.errors import KernelArgumentError
from workbench.kernels.sampling import draw_intervals

__all__ = ["sampling_flips", "flip_at"]


def _probs(name, p) -> torch.Tensor:
    if isinstance(p, (list, tuple, np.ndarray)):
        p = torch.as_tensor(np.asarray(p, dtype=np.float64))
    if not isinstance(p, torch.Tensor) or not p.is_floating_point() or p.dim() != 1:
        raise KernelArgumentError(
            f"{name} must be a 1-D float tensor of probabilities [V], got "
            f"{getattr(p, 'dtype', type(p).__name__)} {tuple(getattr(p, 'shape', ()))}",
            key=name, fix=f"pass {name} = softmax(logits) of one position (workbench.kernels.sampling.softmax)")
    return p


def _segments(probs: torch.Tensor, order) -> tuple[np.ndarray, np.ndarray]:
    """Starts (sorted) and tokens of the positive-width draw intervals of one arm."""
    iv = draw_intervals(probs, order=order).numpy()
    lo, hi = iv[:, 0], iv[:, 1]
    keep = np.flatnonzero(hi > lo)  # zero-probability tokens are never drawn
    s = np.argsort(lo[keep], kind="stable")
    return lo[keep][s], keep[s]


def sampling_flips(p_control, p_candidate, *, order="index", u=None, eps: float = 0.0) -> xr.Dataset:
    """The draws u in [0, 1) for which the two arms sample different tokens.

    Parameters
    ----------
    p_control, p_candidate: ``[V]`` probabilities (non-negative; normalized by their sums)
    order: token order of the cumulative sum: ``"index"``, ``"descending"`` (per arm, by its own
        probabilities) or a permutation tensor ``[V]`` (as in ``stateless_draw``)
    u: optional draws (float or sequence) at which to report both arms' tokens and the flip
    eps: flip intervals narrower than this are dropped (0 keeps all)

    Returns
    -------
    xarray.Dataset along ``interval`` (the maximal flip intervals, ``[lo, hi)``, in u order):
    ``lo``, ``hi``, ``width``, ``token_control``, ``token_candidate``; attr ``total_width``
    (the flip probability under a shared u) and ``n_intervals``. With ``u``: along ``draw``,
    ``u``, ``token_control_at_u``, ``token_candidate_at_u``, ``flipped_at_u``.

    Example
    -------
    >>> ds = sampling_flips([0.760651, 0.239349], [0.839734, 0.160266])   # token 0 = EOS
    >>> round(ds.attrs["total_width"], 6), float(ds.lo[0]), float(ds.hi[0])
    (0.079083, 0.760651, 0.839734)
    """
    pa, pb = _probs("p_control", p_control), _probs("p_candidate", p_candidate)
    if pa.shape != pb.shape:
        raise KernelArgumentError(f"p_candidate must have p_control's shape {tuple(pa.shape)}, got "
                                  f"{tuple(pb.shape)}", key="p_candidate", fix="pass both arms' probabilities "
                                  "over the same vocabulary")
    la, ta = _segments(pa, order)
    lb, tb = _segments(pb, order)
    starts = np.union1d(la, lb)
    ends = np.append(starts[1:], 1.0)
    tok_a = ta[np.searchsorted(la, starts, side="right") - 1]
    tok_b = tb[np.searchsorted(lb, starts, side="right") - 1]
    differ = tok_a != tok_b
    # merge adjacent flip segments with the same token pair into one interval
    idx = np.flatnonzero(differ)
    if len(idx):
        new = np.ones(len(idx), dtype=bool)
        new[1:] = (idx[1:] != idx[:-1] + 1) | (tok_a[idx[1:]] != tok_a[idx[:-1]]) | (tok_b[idx[1:]] != tok_b[idx[:-1]])
        groups = np.cumsum(new) - 1
        first = idx[new]
        last = np.zeros(len(first), dtype=np.int64)
        np.maximum.at(last, groups, idx)
        lo, hi = starts[first], ends[last]
        ka, kb = tok_a[first], tok_b[first]
    else:
        lo = hi = np.zeros(0)
        ka = kb = np.zeros(0, dtype=np.int64)
    width = hi - lo
    keep = width > eps
    lo, hi, width, ka, kb = lo[keep], hi[keep], width[keep], ka[keep], kb[keep]
    ds = xr.Dataset(
        {"lo": ("interval", lo), "hi": ("interval", hi), "width": ("interval", width),
         "token_control": ("interval", ka.astype(np.int64)), "token_candidate": ("interval", kb.astype(np.int64))},
        coords={"interval": np.arange(len(lo))},
    )
    if u is not None:
        uu = np.atleast_1d(np.asarray(u, dtype=np.float64))
        a, b = flip_at(pa, pb, uu, order=order)
        ds = ds.assign({"u": ("draw", uu), "token_control_at_u": ("draw", a), "token_candidate_at_u": ("draw", b),
                        "flipped_at_u": ("draw", a != b)})
    ds["width"].attrs["units"] = "probability (measure of u in [0, 1))"
    order_name = order if isinstance(order, str) else "permutation"
    ds.attrs.update(analysis="sampling_flips", total_width=float(width.sum()), n_intervals=int(len(lo)),
                    order=order_name, vocab=int(pa.shape[0]), eps=float(eps),
                    semantics="stateless inverse-CDF draw (workbench.kernels.sampling.stateless_draw): fp64 "
                              "cumulative sum in token order, normalized; token t drawn when lo_t <= u < hi_t",
                    intervals="half-open [lo, hi)")
    return ds


def flip_at(p_control, p_candidate, u, *, order="index") -> tuple[np.ndarray, np.ndarray]:
    """The tokens both arms draw for the draws ``u`` (float or ``[D]``, each in [0, 1)).

    The same tokens as ``stateless_draw(p, u)``, found by binary search in the arms' draw
    intervals, so many draws over a large vocabulary cost O((V + D) log V), not O(V D).

    Example
    -------
    >>> flip_at([0.760651, 0.239349], [0.839734, 0.160266], 0.8)
    (array([1]), array([0]))
    """
    pa, pb = _probs("p_control", p_control), _probs("p_candidate", p_candidate)
    uu = np.atleast_1d(np.asarray(u, dtype=np.float64))
    if ((uu < 0) | (uu >= 1) | np.isnan(uu)).any():
        raise KernelArgumentError(f"u must be in [0, 1), got {uu[(uu < 0) | (uu >= 1) | np.isnan(uu)][:4].tolist()}",
                                  key="u", fix="pass uniform draws in [0, 1)")
    out = []
    for p in (pa, pb):
        lo, tok = _segments(p, order)
        out.append(tok[np.searchsorted(lo, uu, side="right") - 1].astype(np.int64))
    return out[0], out[1]
