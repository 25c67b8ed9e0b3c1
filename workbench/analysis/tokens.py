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

from pathlib import Path

import numpy as np
import torch
import xarray as xr

from workbench.capture.reader import Capture, open_capture
from workbench.errors import AnalysisError

__all__ = ["find_tokens", "find_logits", "find_hidden", "first_rank", "load_weight", "token_agreement", "parse_tensor"]

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
    its op or name (None: no such tensor). Ambiguous: AnalysisError listing the candidates.

    A recorded module's input (``input``, ``inputs.N``) is what the model was fed, not what it
    picked: ``model.embed_tokens/input`` holds the prompt ids, equal in both arms by construction,
    so it is never taken for the sampled tokens (the logits' argmax is read instead)."""
    cap = _cap(cap)
    idx = cap.index
    named = idx["op"].str.contains("token|sampl", case=False) | idx["name"].str.contains("token", case=False)
    fed = idx["name"].str.fullmatch(r"inputs?(\..*)?")
    cands = _per_step(cap, idx["dtype"].isin(_INT) & named & ~fed)
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


def _by_position(cap: Capture, toks: dict[int, list[int]]) -> dict[tuple, int] | None:
    """``{(request, last position): token}``: each step's tokens keyed by the request and position
    they follow (None: the capture has no batch rows at some step)."""
    from workbench.capture.align import batch_rows

    out = {}
    for step, ts in toks.items():
        rows = batch_rows(cap, step)
        if rows is None:
            return None
        last: dict[str, int] = {}
        for rq, p in rows:
            last[rq] = max(last.get(rq, -1), p)
        for rq, t in zip(last, ts):
            out[(rq, last[rq])] = t
    return out


def token_agreement(control, candidate, *, tokens: str | None = None, logits: str | None = None,
                    align: str = "auto") -> xr.Dataset:
    """The tokens of both arms per step and whether they agree.

    Parameters
    ----------
    control, candidate: captures or paths
    tokens: ``"op/name"`` of the sampled-token tensor (default: detected, :func:`find_tokens`)
    logits: ``"op/name"`` of the logits, used when there is no token tensor (default: detected)
    align: "steps" pairs step with step; "tokens" pairs each control token with the candidate's
        token that follows the same request and position (arms that chunk or batch differently:
        a 64 + 64 chunked prefill samples after its second step what an unchunked one samples after
        its first; needs batch rows, :meth:`CaptureWriter.add_batch`); "auto" (default): "tokens"
        when both arms record batch rows, else "steps"

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
    if align not in ("auto", "steps", "tokens"):
        raise AnalysisError(f"align must be 'auto', 'steps' or 'tokens', got {align!r}", key="align",
                            fix="pass align='tokens' for arms that chunk or batch differently")
    pairing = "step"
    if align != "steps":
        pa, pb = _by_position(ctl, a), _by_position(cand, b)
        if pa is None or pb is None:
            if align == "tokens":
                arm = ctl if pa is None else cand
                raise AnalysisError(f"{arm.path} has no batch rows at every step: its tokens cannot be paired by "
                                    "position", key="align", file=arm.path,
                                    fix="record them with CaptureWriter.add_batch, or pass align='steps'")
        else:  # the candidate's token after the same (request, position) as each control step's
            pairing = "request and position"
            where = {}
            from workbench.capture.align import batch_rows
            for step in a:
                last: dict[str, int] = {}
                for rq, p in batch_rows(ctl, step):
                    last[rq] = max(last.get(rq, -1), p)
                where[step] = list(last.items())
            b = {s: [pb[k] for k in where[s]] for s in a if all(k in pb for k in where[s])}
    steps = sorted(set(a) | set(b)) if pairing == "step" else sorted(a)
    agree = np.array([a.get(s) == b.get(s) and s in a and s in b for s in steps], dtype=bool)
    first = next((s for s, ok in zip(steps, agree) if not ok), -1)
    source = f"argmax of {op}/{name}" if from_logits else f"{op}/{name}"
    ds = xr.Dataset({"control": ("step", [a[s][0] if s in a else -1 for s in steps]),
                     "candidate": ("step", [b[s][0] if s in b else -1 for s in steps]),
                     "agree": ("step", agree)}, coords={"step": steps})
    n = int(agree.sum())
    sentence = (f"tokens identical in both arms for {n}/{len(steps)} steps ({source})" if first < 0 else
                f"tokens differ from step {first} on ({n}/{len(steps)} steps agree; {source})")
    if pairing != "step":
        sentence += "; paired by request and position (the control's steps)"
    ds.attrs.update(analysis="token_agreement", source=source, n_steps=len(steps), n_agree=n,
                    first_differing_step=int(first), sentence=sentence, pairing=pairing)
    return ds


def _has(cap: Capture, op: str, name: str) -> bool:
    return bool(((cap.index["op"] == op) & (cap.index["name"] == name)).any())


def find_hidden(cap, logits: tuple[str, str]) -> tuple[str, str] | None:
    """The hidden states entering the lm_head: the ``input`` (``inputs.0``, ``hidden_states``) of
    the op that produced the logits, or its only other float tensor, at every step (None: the
    capture does not hold them; name them with ``hidden='op/name'``)."""
    cap = _cap(cap)
    op = logits[0]
    others = [c for c in _per_step(cap, cap.index["dtype"].isin(_FLOAT)) if c[0] == op and c != tuple(logits)]
    for name in ("input", "inputs.0", "input0", "hidden_states"):
        if (op, name) in others:
            return op, name
    return others[0] if len(others) == 1 else None


def _check_weight(w, where: str, V: int, D: int | None) -> torch.Tensor:
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dim() != 2 or w.shape[0] != V or (
            D is not None and w.shape[1] != D):
        want = f"[V={V}, D={D if D is not None else '?'}]"
        raise AnalysisError(f"{where} is not an lm_head weight {want}: got {getattr(w, 'dtype', type(w).__name__)} "
                            f"{tuple(getattr(w, 'shape', ()))}", key="weight",
                            fix="name the lm_head weight as stored by nn.Linear ([vocab, hidden], not transposed)")
    return w


def first_rank(cap, op: str, name: str) -> int:
    """The lowest rank holding ``op/name`` (0 when none does): replicated tensors are read once."""
    rows = _cap(cap).index
    ranks = rows["rank"][(rows["op"] == op) & (rows["name"] == name)]
    return int(ranks.min()) if len(ranks) else 0


def load_weight(cap, spec, *, vocab: int, hidden: int | None = None) -> tuple[torch.Tensor | None, str]:
    """The lm_head weight ``[vocab, hidden]`` and where it came from.

    ``spec``: a tensor (checked for that shape), ``"op/name"`` of a tensor in the capture, ``"file.safetensors:tensor"`` (a checkpoint
    shard; read with safetensors, never unpickled), or empty: detected in the capture (a 2-D float
    tensor of that shape, preferring one named ``weight``), else ``(None, reason)``.
    """
    cap = _cap(cap)
    if isinstance(spec, torch.Tensor):
        return _check_weight(spec, "the weight given", vocab, hidden), "the weight given"
    if spec:
        path, sep, key = str(spec).rpartition(":")
        if sep and path.endswith(".safetensors"):
            from safetensors import SafetensorError, safe_open

            p = Path(path).expanduser()
            if not p.is_file():
                raise AnalysisError(f"weight file {p} does not exist", key="weight", file=p,
                                    fix="pass weight='path/to/model.safetensors:lm_head.weight'")
            try:
                with safe_open(str(p), framework="pt") as f:
                    if key not in f.keys():
                        raise AnalysisError(f"{p} has no tensor {key!r} (it has {sorted(f.keys())[:12]}...)",
                                            key="weight", file=p, fix="name the lm_head weight after the ':'")
                    w = f.get_tensor(key)
            except SafetensorError as e:
                raise AnalysisError(f"{p} is not a readable safetensors file: {e}", key="weight", file=p,
                                    fix="point weight= at a .safetensors checkpoint shard") from e
            return _check_weight(w, f"{p}:{key}", vocab, hidden), f"{p.name}:{key}"
        op, name = parse_tensor(spec, "weight")
        if not _has(cap, op, name):
            raise AnalysisError(f"{cap.path} has no tensor {op}/{name}", key="weight", file=cap.path,
                                fix="name a tensor of the capture ('op/name') or 'file.safetensors:tensor'")
        v = cap.select(op=op, name=name)
        return _check_weight(v._tensor(v.index.iloc[0]), f"{cap.path} {op}/{name}", vocab, hidden), f"{op}/{name}"
    idx = cap.index
    shapes = idx["shape"].map(lambda s: list(s) == [vocab, hidden] if hidden is not None else
                              (len(s) == 2 and s[0] == vocab))
    cands = idx[shapes & idx["dtype"].isin(_FLOAT)].drop_duplicates(["op", "name"])
    if len(cands) > 1:
        named = cands[cands["name"] == "weight"]
        cands = named if len(named) else cands
    if len(cands) > 1:
        raise AnalysisError(f"several [vocab={vocab}, {hidden}] tensors in {cap.path} could be the lm_head weight: "
                            f"{[f'{o}/{n}' for o, n in zip(cands['op'], cands['name'])]}", key="weight",
                            file=cap.path, fix="name one with weight='op/name'")
    if len(cands) == 0:
        return None, f"no [vocab={vocab}, hidden={hidden}] weight in {cap.path}"
    op, name = cands["op"].iloc[0], cands["name"].iloc[0]
    v = cap.select(op=op, name=name)
    return v._tensor(v.index.iloc[0]), f"{op}/{name}"
