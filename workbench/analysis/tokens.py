"""Do the arms pick the same tokens? The first thing an engineer checks, from the tensors.

The tokens come from a capture's sampled-token tensor when it has one (an integer tensor at
layer -1 named like ``token``), else from the argmax of its logits (the lm_head-like float tensor
at layer -1 with the largest last dimension, at the last position). Engines name these
differently; :func:`find_tokens` and :func:`find_logits` detect them and say which candidates
they saw when the choice is ambiguous, and an explicit ``"op/name"`` always wins.

Example
-------
>>> ds = token_agreement("captures/control", "captures/candidate")      # doctest: +SKIP
>>> ds.attrs["first_differing_step"], ds.attrs["source"]                 # doctest: +SKIP
(-1, 'sampler/token')
"""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from workbench.capture.reader import Capture, open_capture
from workbench.errors import AnalysisError

__all__ = ["find_tokens", "find_logits", "token_agreement", "parse_tensor"]

_INT = ("int64", "int32", "int16", "int8", "uint8")
_FLOAT = ("fp32", "bf16", "fp16", "fp64")


def _cap(c) -> Capture:
    return c if isinstance(c, Capture) else open_capture(c)


def parse_tensor(spec: str, what: str) -> tuple[str, str]:
    """``"op/name"`` -> (op, name); the op may contain dots and slashes up to the last slash."""
    op, sep, name = str(spec).rpartition("/")
    if not sep or not op or not name:
        raise AnalysisError(f"{what} must be 'op/name', got {spec!r}", key=what,
                            fix=f"pass {what}='lm_head/output' (see the capture's index for op and name)")
    return op, name


def _per_step(cap: Capture, mask) -> list[tuple[str, str]]:
    """(op, name) pairs among the rows of ``mask`` at layer -1 present at every step of the capture."""
    idx = cap.index
    steps = set(idx["step"].unique().tolist())
    sub = idx[mask & (idx["layer"] == -1)]
    return [(o, n) for (o, n), g in sub.groupby(["op", "name"], sort=True) if set(g["step"]) == steps]


def find_tokens(cap) -> tuple[str, str] | None:
    """The sampled-token tensor: an integer tensor at layer -1, at every step, with ``token`` in
    its op or name (None: no such tensor). Ambiguous: AnalysisError listing the candidates."""
    cap = _cap(cap)
    idx = cap.index
    named = idx["op"].str.contains("token|sampl", case=False) | idx["name"].str.contains("token", case=False)
    cands = _per_step(cap, idx["dtype"].isin(_INT) & named)
    if len(cands) > 1:
        raise AnalysisError(f"several token tensors in {cap.path}: {['/'.join(c) for c in cands]}", key="tokens",
                            file=cap.path, fix="name one with tokens='op/name'")
    return cands[0] if cands else None


def find_logits(cap) -> tuple[str, str]:
    """The logits tensor: among float tensors at layer -1 present at every step, those with the
    largest last dimension (the vocabulary); ties broken by an ``lm_head`` op, then a ``logits``
    name. Ambiguous or absent: AnalysisError listing the candidates."""
    cap = _cap(cap)
    idx = cap.index
    cands = _per_step(cap, idx["dtype"].isin(_FLOAT))
    if not cands:
        raise AnalysisError(f"no float tensor at layer -1 in every step of {cap.path}: no logits to read tokens from",
                            key="logits", file=cap.path,
                            fix="record the lm_head (or pass tokens='op/name' / logits='op/name')")
    last = {c: int(idx[(idx["op"] == c[0]) & (idx["name"] == c[1])]["shape"].iloc[0][-1]) for c in cands}
    top = max(last.values())
    best = [c for c in cands if last[c] == top]
    for pick in (lambda c: c[0] == "lm_head", lambda c: "lm_head" in c[0], lambda c: "logits" in c[1]):
        if len(best) > 1 and any(pick(c) for c in best):
            best = [c for c in best if pick(c)]
    if len(best) > 1:
        raise AnalysisError(f"several logits-like tensors (last dim {top}) in {cap.path}: "
                            f"{['/'.join(c) for c in best]}", key="logits", file=cap.path,
                            fix="name one with logits='op/name'")
    return best[0]


def _step_tokens(cap: Capture, op: str, name: str, from_logits: bool) -> dict[int, list[int]]:
    out = {}
    for step in sorted(cap.index["step"].unique().tolist()):
        rows = cap.index[(cap.index["step"] == step) & (cap.index["op"] == op) & (cap.index["name"] == name)
                         & (cap.index["layer"] == -1)]
        ranks = sorted(rows["rank"].unique().tolist())
        t = cap.get(rank=ranks[0], step=step, layer=-1, op=op, name=name)
        if from_logits:
            x = t.float()
            x = x[..., -1, :] if x.dim() >= 3 else (x[-1] if x.dim() == 2 else x)
            out[step] = torch.argmax(x.reshape(-1, x.shape[-1]), dim=-1).tolist()
        else:
            out[step] = t.reshape(-1).tolist()
    return out


def token_agreement(control, candidate, *, tokens: str | None = None, logits: str | None = None) -> xr.Dataset:
    """The tokens of both arms per step and whether they agree.

    Parameters
    ----------
    control, candidate: captures or paths
    tokens: ``"op/name"`` of the sampled-token tensor (default: detected, :func:`find_tokens`)
    logits: ``"op/name"`` of the logits, used when there is no token tensor (default: detected)

    Returns
    -------
    xarray.Dataset along dim ``step`` (the steps both arms hold): ``control``, ``candidate`` (the
    first token of each step's tokens, -1 where the arm lacks the step), ``agree`` (every token of
    the step equal); attrs ``source`` ("op/name", "argmax of op/name"), ``n_steps``,
    ``n_agree``, ``first_differing_step`` (-1: none) and ``sentence``.
    """
    ctl, cand = _cap(control), _cap(candidate)
    if tokens:
        spec, from_logits = parse_tensor(tokens, "tokens"), False
    else:
        found = find_tokens(ctl)
        spec, from_logits = (found, False) if found else (parse_tensor(logits, "logits") if logits else
                                                          find_logits(ctl), True)
    op, name = spec
    for c in (ctl, cand):
        if not ((c.index["op"] == op) & (c.index["name"] == name)).any():
            raise AnalysisError(f"{c.path} has no tensor {op}/{name}", key="tokens" if not from_logits else "logits",
                                file=c.path, fix="name the tensor each arm holds with tokens=/logits='op/name'")
    a, b = _step_tokens(ctl, op, name, from_logits), _step_tokens(cand, op, name, from_logits)
    steps = sorted(set(a) | set(b))
    agree = np.array([a.get(s) == b.get(s) and s in a and s in b for s in steps], dtype=bool)
    first = next((s for s, ok in zip(steps, agree) if not ok), -1)
    source = f"argmax of {op}/{name}" if from_logits else f"{op}/{name}"
    ds = xr.Dataset({"control": ("step", [a[s][0] if s in a else -1 for s in steps]),
                     "candidate": ("step", [b[s][0] if s in b else -1 for s in steps]),
                     "agree": ("step", agree)}, coords={"step": steps})
    n = int(agree.sum())
    sentence = (f"tokens identical in both arms for {n}/{len(steps)} steps ({source})" if first < 0 else
                f"tokens differ from step {first} on ({n}/{len(steps)} steps agree; {source})")
    ds.attrs.update(analysis="token_agreement", source=source, n_steps=len(steps), n_agree=n,
                    first_differing_step=int(first), sentence=sentence)
    return ds
