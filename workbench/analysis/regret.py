"""Regret against a golden model: at every sequence and decode position, how many nats does the
token the candidate selected lose under a golden model's log-probabilities?

``regret[seq, pos] = max_t log p_golden(t) - log p_golden(selected)`` (FP64 log-softmax of the
golden logits at that position, given the same context). A kernel bug that touches only some rows
of a batch (a padded sequence, a relocated page, a split boundary) shows as regret at those rows
and positions only. The golden arm is a capture (a reference engine or a Hugging Face run scoring
the same positions) or a model run here (:func:`golden_logits_hf`: teacher-forced on the
candidate's own tokens, one sequence at a time, unpadded).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import xarray as xr

from workbench.errors import KernelArgumentError

__all__ = ["golden_regret", "golden_regret_captures", "golden_logits_hf", "load_hf_model", "describe_regret", "with_limit"]


def golden_regret(selected, golden_logits, *, limit: float = 0.20) -> xr.Dataset:
    """Regret of the selected tokens under golden logits.

    Parameters
    ----------
    selected: ``[seq, pos]`` int token ids the candidate selected (``-1``: no token, e.g. a
        finished sequence; left out)
    golden_logits: ``[seq, pos, V]`` golden logits at the same positions (NaN rows: left out)
    limit: nats; a position fails when its regret exceeds it

    Returns
    -------
    xarray.Dataset over (``seq``, ``pos``): ``regret`` (nats, NaN where left out), ``selected``,
    ``golden_token`` (the golden argmax), ``p_selected`` / ``p_golden`` (golden probabilities of
    both), ``fails``; scalars ``worst``, ``worst_seq``, ``worst_pos``, ``n_fail``, ``n_scored``.

    Example
    -------
    >>> ds = golden_regret([[1]], [[[0.25, 0.0, -5.0]]])
    >>> round(float(ds.worst), 12), int(ds.golden_token[0, 0])
    (0.25, 0)
    """
    sel = np.asarray(selected)
    g = torch.as_tensor(np.asarray(golden_logits, dtype=np.float64))
    if sel.ndim == 1:
        sel, g = sel[None], g[None]
    if g.dim() != 3 or tuple(g.shape[:2]) != sel.shape:
        raise KernelArgumentError(f"golden logits {tuple(g.shape)} do not match the selected tokens {sel.shape} "
                                  "as [seq, pos, V] vs [seq, pos]", key="golden_logits",
                                  fix="give the golden model's logits at the same sequences and positions")
    if not np.issubdtype(sel.dtype, np.integer):
        raise KernelArgumentError(f"selected tokens must be integers, got {sel.dtype}", key="selected",
                                  fix="pass token ids")
    V = g.shape[-1]
    if (sel >= V).any():
        raise KernelArgumentError(f"a selected token id ({int(sel.max())}) is outside the golden vocabulary {V}",
                                  key="selected", fix="compare against a golden model with the same vocabulary")
    lp = torch.log_softmax(g, -1)
    ok = (sel >= 0) & torch.isfinite(g).all(-1).numpy()
    idx = torch.as_tensor(np.where(ok, sel, 0))
    lp_sel = lp.gather(-1, idx[..., None])[..., 0].numpy()
    lp_best, best = (v.numpy() for v in lp.max(-1))
    regret = np.where(ok, lp_best - lp_sel, np.nan)
    fails = np.where(ok, regret > limit, False)
    S, P = sel.shape
    if ok.any():
        w = int(np.nanargmax(np.where(ok, regret, -np.inf)))
        ws, wp, worst = w // P, w % P, float(regret.reshape(-1)[w])
    else:
        ws, wp, worst = -1, -1, float("nan")
    ds = xr.Dataset(
        {"regret": (("seq", "pos"), regret), "selected": (("seq", "pos"), sel.astype(np.int64)),
         "golden_token": (("seq", "pos"), np.where(ok, best, -1).astype(np.int64)),
         "p_selected": (("seq", "pos"), np.where(ok, np.exp(lp_sel), np.nan)),
         "p_golden": (("seq", "pos"), np.where(ok, np.exp(lp_best), np.nan)),
         "fails": (("seq", "pos"), fails),
         "worst": worst, "worst_seq": ws, "worst_pos": wp, "n_fail": int(fails.sum()), "n_scored": int(ok.sum())},
        coords={"seq": np.arange(S), "pos": np.arange(P)},
    )
    ds["regret"].attrs["units"] = "nats (golden log-prob of its best token minus that of the selected token)"
    ds.attrs.update(analysis="golden_regret", limit=float(limit))
    return ds


def describe_regret(ds: xr.Dataset) -> str:
    """The finding in words: the worst position, and every position over the limit."""
    lim = ds.attrs["limit"]
    if int(ds.n_scored) == 0:
        return "no position could be scored against the golden model"
    s, p = int(ds.worst_seq), int(ds.worst_pos)
    head = (f"worst regret {float(ds.worst):.6g} nats at seq {s}, pos {p} (selected {int(ds.selected[s, p])}, golden "
            f"best {int(ds.golden_token[s, p])}, golden p {float(ds.p_selected[s, p]):.4g} vs "
            f"{float(ds.p_golden[s, p]):.4g}) over {int(ds.n_scored)} positions; ")
    if int(ds.n_fail) == 0:
        return head + f"none over the {lim:g}-nat limit"
    where = [f"seq {int(a)} pos {int(b)} ({float(ds.regret[a, b]):.4g})" for a, b in zip(*np.nonzero(ds.fails.values))]
    return head + f"{int(ds.n_fail)} over the {lim:g}-nat limit: " + ", ".join(where[:12]) + (" ..." if len(where) > 12 else "")


def _per_step(cap, spec) -> tuple[list[int], dict[int, torch.Tensor]]:
    from workbench.analysis.tokens import first_rank

    op, name = spec
    rank = first_rank(cap, op, name)
    sel = cap.index[(cap.index["op"] == op) & (cap.index["name"] == name) & (cap.index["layer"] == -1)
                    & (cap.index["rank"] == rank)]
    steps = sorted(int(s) for s in sel["step"].unique())
    return steps, {s: cap.get(rank=rank, step=s, layer=-1, op=op, name=name) for s in steps}


def golden_regret_captures(candidate, golden, *, logits: str | None = None, golden_logits: str | None = None,
                           tokens: str | None = None, limit: float = 0.20) -> xr.Dataset:
    """:func:`golden_regret` of a candidate capture against a golden capture of the same positions.

    Per step, the candidate's selected tokens (its token tensor, detected or ``tokens="op/name"``;
    else the argmax of its logits) are one per batch row: ``seq`` is the batch row, ``pos`` the
    step. The golden capture's logits (detected or ``golden_logits="op/name"``) at the same step
    hold a ``[V]`` or ``[rows, V]`` tensor, the last position's row of each sequence being the one
    that predicts the step's token (``[rows, T, V]`` prefill logits are cut to their last position).
    """
    from workbench.analysis.logits import _open
    from workbench.analysis.tokens import _step_tokens, find_logits, find_tokens, parse_tensor

    cand, gold = _open(candidate), _open(golden)
    lspec = parse_tensor(logits, "logits") if logits else find_logits(cand)
    gspec = parse_tensor(golden_logits, "golden_logits") if golden_logits else find_logits(gold)
    tspec = parse_tensor(tokens, "tokens") if tokens else find_tokens(cand)
    toks = _step_tokens(cand, *tspec, from_logits=False) if tspec else _step_tokens(cand, *lspec, from_logits=True)
    gsteps, glog = _per_step(gold, gspec)
    steps = [s for s in sorted(toks) if s in glog]
    if not steps:
        raise KernelArgumentError(f"the golden capture {gold.path} has logits at no step the candidate selected a "
                                  f"token (golden steps {gsteps[:8]}, candidate {sorted(toks)[:8]})", key="golden",
                                  fix="capture the golden model at the same decode steps")
    rows = max(len(toks[s]) for s in steps)
    V = None
    sel = np.full((rows, len(steps)), -1, dtype=np.int64)
    gl = None
    for j, s in enumerate(steps):
        g = glog[s].double()
        g = g[..., -1, :] if g.dim() >= 3 else g
        g = g.reshape(-1, g.shape[-1])
        if V is None:
            V = g.shape[-1]
            gl = np.full((rows, len(steps), V), np.nan)
        if g.shape[0] != len(toks[s]) and g.shape[0] != 1:
            raise KernelArgumentError(f"step {s}: the golden capture holds {g.shape[0]} rows of logits but the "
                                      f"candidate selected {len(toks[s])} tokens", key="golden",
                                      fix="capture the golden arm with the candidate's batch rows, one per sequence")
        t = np.asarray(toks[s], dtype=np.int64)
        sel[:len(t), j] = t
        gl[:len(t), j] = g.expand(len(t), -1).numpy() if g.shape[0] == 1 else g.numpy()
    ds = golden_regret(sel, gl, limit=limit)
    ds = ds.assign_coords(step=("pos", steps))
    ds.attrs.update(candidate=str(cand.path), golden=str(gold.path), golden_logits="/".join(gspec),
                    tokens="/".join(tspec) if tspec else f"argmax of {'/'.join(lspec)}")
    return ds


def load_hf_model(path, *, seed: int = 0):
    """A Hugging Face causal LM from a folder: its weights when the folder holds them
    (``from_pretrained``), else random weights from ``seed`` for its config.json (``from_config``);
    fp32, eval."""
    from pathlib import Path

    try:
        from transformers import AutoConfig, AutoModelForCausalLM
    except ImportError:
        raise KernelArgumentError("a Hugging Face model needs transformers", key="model",
                                  fix="pip install transformers (in the dev extra)") from None
    p = Path(path)
    d = p if p.is_dir() else p.parent
    if not (d / "config.json").is_file():
        raise KernelArgumentError(f"no config.json at {path}", key="model",
                                  fix="pass a Hugging Face model folder (config.json, and weights if it has them)")
    if any(d.glob("*.safetensors")):
        return AutoModelForCausalLM.from_pretrained(str(d), use_safetensors=True).float().eval(), "weights"
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(d))).float().eval(), f"random weights, seed {seed}"


def golden_logits_hf(model, prompts: Sequence, selected: Sequence[Sequence[int]]) -> np.ndarray:
    """Golden logits ``[seq, pos, V]`` from a Hugging Face model: each sequence alone (no padding),
    teacher-forced on the tokens the candidate selected, the logits that predict each of them.
    Sequences shorter than the longest are NaN-padded (left out by :func:`golden_regret`)."""
    P = max(len(s) for s in selected)
    out = None
    with torch.no_grad():
        for i, (p, s) in enumerate(zip(prompts, selected)):
            p = [int(t) for t in p]
            s = [int(t) for t in s if int(t) >= 0]
            if not s:
                continue
            logits = model(torch.tensor([p + s[:-1]])).logits[0, len(p) - 1:].double().numpy()
            if out is None:
                out = np.full((len(selected), P, logits.shape[-1]), np.nan)
            out[i, :len(s)] = logits[:len(s)]
    if out is None:
        raise KernelArgumentError("no sequence selected any token", key="selected", fix="pass the candidate's tokens")
    return out


def with_limit(ds: xr.Dataset, limit: float) -> xr.Dataset:
    """The same regrets judged against another limit (``fails`` and ``n_fail`` recomputed)."""
    fails = (ds.regret > limit).fillna(False).astype(bool)
    out = ds.assign(fails=fails, n_fail=int(fails.sum()))
    out.attrs = {**ds.attrs, "limit": float(limit)}
    return out
