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

from workbench.errors import AnalysisError, CaptureError, KernelArgumentError, KeyNotFoundError
from workbench.kernels.sampling import draw_intervals

__all__ = ["sampling_flips", "sampling_flips_captures", "flip_at", "read_vocab", "token_label"]


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
    ``lo``, ``hi``, ``width``, ``token_control``, ``token_candidate``; along ``flip_token`` (every
    token of a flip interval) ``p_control`` and ``p_candidate``; attr ``total_width``
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
    # the tokens a shared draw can move between, with both arms' probabilities
    ft = np.unique(np.concatenate([ka, kb])).astype(np.int64)
    na, nb = float(pa.double().sum()), float(pb.double().sum())
    ds = ds.assign_coords(flip_token=("flip_token", ft)).assign(
        p_control=("flip_token", (pa.double()[torch.as_tensor(ft)] / na).numpy() if len(ft) else np.zeros(0)),
        p_candidate=("flip_token", (pb.double()[torch.as_tensor(ft)] / nb).numpy() if len(ft) else np.zeros(0)))
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


def sampling_flips_captures(control, candidate, *, logits: str | None = None, tokens: str | None = None,
                            step: int | None = None, temperature: float = 1.0, order="index",
                            vocab: dict[int, str] | str | None = None) -> xr.Dataset:
    """:func:`sampling_flips` of two captures' logits at one step, chosen from the tensors.

    The logits are detected per arm (:func:`workbench.analysis.tokens.find_logits`) unless
    ``logits="op/name"`` names them; probabilities are the FP64 softmax at ``temperature``. Only
    steps whose prefixes agree compare like with like (after the arms' tokens differ, they sample
    from different contexts), so the flip width and total variation are computed for every step
    up to and including the first differing step, and ``step=None`` picks the one where the arms'
    distributions differ most (largest total variation).

    Returns
    -------
    the :func:`sampling_flips` Dataset of that step, plus along ``step`` (the compared steps)
    ``tv_by_step`` and ``width_by_step``; attrs ``step``, ``step_reason``, ``tv`` (total
    variation at that step), ``first_differing_step``, ``logits`` and ``sentence`` (tokens named
    from ``vocab``: a mapping id -> text or a tokenizer file for :func:`read_vocab`).
    """
    from workbench.analysis.logits import _arm_logits, _open
    from workbench.analysis.tokens import token_agreement

    if not (isinstance(temperature, (int, float)) and temperature > 0):
        raise KernelArgumentError(f"temperature must be > 0, got {temperature!r}", key="temperature",
                                  fix="pass temperature=1.0")
    ctl, cand = _open(control), _open(candidate)
    (sa, ra, st_a), (sb, rb, st_b) = _arm_logits(ctl, logits), _arm_logits(cand, logits)
    steps = sorted(set(st_a.tolist()) & set(st_b.tolist()))
    if not steps or ra.shape[-1] != rb.shape[-1]:
        raise KernelArgumentError(f"the arms' logits share no step of the same vocabulary ({'/'.join(sa)} "
                                  f"{tuple(ra.shape)}, {'/'.join(sb)} {tuple(rb.shape)})", key="logits",
                                  fix="compare two runs of the same model over the same steps")
    try:
        first = int(token_agreement(ctl, cand, tokens=tokens, logits=logits).attrs["first_differing_step"])
    except (AnalysisError, KeyNotFoundError):  # no shared token tensor: greedy of the logits
        ga, gb = ra.float().argmax(-1), rb.float().argmax(-1)
        bad = [s for s in steps if int(ga[list(st_a).index(s)]) != int(gb[list(st_b).index(s)])]
        first = bad[0] if bad else -1
    compared = [s for s in steps if first < 0 or s <= first]
    pa = {s: torch.softmax(ra[list(st_a).index(s)].double() / temperature, -1) for s in compared}
    pb = {s: torch.softmax(rb[list(st_b).index(s)].double() / temperature, -1) for s in compared}
    tv = np.array([0.5 * float((pa[s] - pb[s]).abs().sum()) for s in compared])
    if step is None:
        at, reason = compared[int(np.argmax(tv))], "the largest total variation among steps whose prefixes agree"
    elif step in pa:
        at, reason = int(step), "the step asked for"
    else:
        raise KernelArgumentError(f"step {step} is not comparable: the arms' prefixes agree only at steps "
                                  f"{compared[0]}..{compared[-1]}", key="step", fix="pass one of those, or step=None")
    ds = sampling_flips(pa[at], pb[at], order=order)
    widths = [ds.attrs["total_width"] if s == at else sampling_flips(pa[s], pb[s], order=order).attrs["total_width"]
              for s in compared]
    ds = ds.assign_coords(step=("step", compared)).assign(tv_by_step=("step", tv), width_by_step=("step", widths))
    i = compared.index(at)
    names = read_vocab(vocab) if isinstance(vocab, (str, bytes)) or hasattr(vocab, "__fspath__") else vocab
    sentence = (f"step {at}: a shared draw u samples different tokens with probability {ds.attrs['total_width']:.6g} "
                f"({ds.attrs['n_intervals']} interval(s); total variation {tv[i]:.6g})")
    if ds.sizes["interval"]:
        big = ds.isel(interval=int(np.argmax(ds.width.values)))
        a, b = int(big.token_control), int(big.token_candidate)
        pc, pk = ds.p_control.sel(flip_token=[a, b]).values, ds.p_candidate.sel(flip_token=[a, b]).values
        sentence += (f"; the widest, u in [{float(big.lo):.6f}, {float(big.hi):.6f}), draws {token_label(a, names)} "
                     f"under control and {token_label(b, names)} under candidate: {token_label(b, names)} "
                     f"{pc[1]:.6f} -> {pk[1]:.6f}, {token_label(a, names)} {pc[0]:.6f} -> {pk[0]:.6f}")
    sentence += f" ({reason}; {len(compared)} step(s) compared)"
    if names:
        ds = ds.assign(token_text=("flip_token", [names.get(int(t), "") for t in ds.flip_token.values]))
    ds.attrs.update(step=int(at), step_reason=reason, tv=float(tv[i]), first_differing_step=int(first),
                    logits={"control": "/".join(sa), "candidate": "/".join(sb)}, temperature=float(temperature),
                    sentence=sentence, max_width=float(max(widths)))
    return ds


def _byte_decoder() -> dict[str, int]:
    # the printable stand-ins byte-level BPE vocabularies use for the 256 bytes, inverted
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def read_vocab(path) -> dict[int, str]:
    """Token id -> text from a tokenizer file: Hugging Face ``tokenizer.json`` (its model vocab and
    added tokens; byte-level stand-ins such as ``Ċ`` decoded to the bytes they mean), a
    ``vocab.json`` mapping text -> id, a JSON list, or a text file with one token per line.

    Example
    -------
    >>> read_vocab("tokenizer.json")[198]                                   # doctest: +SKIP
    '\\n'
    """
    import json
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        for cand in ("tokenizer.json", "vocab.json", "vocab.txt"):
            if (p / cand).is_file():
                p = p / cand
                break
    if not p.is_file():
        raise KernelArgumentError(f"no tokenizer file at {path}", key="tokenizer",
                                  fix="pass a tokenizer.json, vocab.json or vocab.txt (or the folder holding one)")
    text = p.read_text(encoding="utf-8")
    if p.suffix != ".json":
        return {i: t for i, t in enumerate(text.splitlines())}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise CaptureError(f"{p}: not valid JSON ({e})", file=p, key="tokenizer",
                                 fix="pass the tokenizer.json or vocab.json the model was served with") from None
    byte_level = False
    if isinstance(data, dict) and isinstance(data.get("model"), dict):
        byte_level = "ByteLevel" in json.dumps(data.get("decoder") or data.get("pre_tokenizer") or {})
        vocab = data["model"].get("vocab", {})
        if isinstance(vocab, list):  # unigram: [[piece, score], ...]
            out = {i: str(v[0]) for i, v in enumerate(vocab)}
        else:
            out = {int(i): str(t) for t, i in vocab.items()}
        if byte_level:
            dec = _byte_decoder()
            out = {i: (bytes(dec[c] for c in t).decode("utf-8", "replace") if all(c in dec for c in t) else t)
                   for i, t in out.items()}
        for a in data.get("added_tokens") or []:
            out[int(a["id"])] = str(a["content"])
        return out
    if isinstance(data, dict):
        return {int(i): str(t) for t, i in data.items()}
    if isinstance(data, list):
        return {i: str(t) for i, t in enumerate(data)}
    raise CaptureError(f"{p}: expected a tokenizer.json, a text -> id mapping or a list", file=p,
                             key="tokenizer", fix="pass the tokenizer.json or vocab.json the model was served with")


def token_label(token: int, vocab: dict[int, str] | None = None) -> str:
    """``'\\n' (198)`` with a vocabulary, else ``198``."""
    if vocab and int(token) in vocab:
        return f"{vocab[int(token)]!r} ({int(token)})"
    return str(int(token))
