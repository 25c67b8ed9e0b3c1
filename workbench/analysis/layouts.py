"""Findings in words for runs of other parallel layouts or chunkings (notebooks/layouts.ipynb).

Each function turns a :class:`~workbench.analysis.compare.ComparisonResult` (and the token
agreement) into one sentence and its machine-readable data, from the tensors only.
"""

from __future__ import annotations

import math

__all__ = ["divergence_sentence", "pair_finding", "chunked_finding"]


def divergence_sentence(res) -> str:
    """"first divergence: step s, layer l, op/name, rel_l2 x" or "no divergence ... (worst x)"."""
    f = res.first_divergence()
    if f is None:
        worst = float(res.table["rel_l2"].max()) if len(res.table) else math.nan
        return f"no divergence beyond the thresholds (worst rel_l2 {worst:.2e})"
    rank = "" if getattr(res, "grouping", "raw") == "logical" else f"rank {int(f['rank'])}, "
    return (f"first divergence: {rank}step {int(f['step'])}, layer {int(f['layer'])}, {f['op']}/{f['name']}, "
            f"rel_l2 {float(f['rel_l2']):.2e}")


def pair_finding(res, *, tokens=None) -> tuple[str, dict]:
    """Control against a candidate of another layout: the divergence, the rank whose piece differs
    most (logical grouping), replicas that disagree, and the tokens."""
    f = res.first_divergence()
    by_rank = res.by_rank() if f is not None and res.grouping == "logical" else None
    text = f"{res.candidate_arm} against {res.control_arm} ({res.grouping} grouping): {divergence_sentence(res)}"
    rank = None
    if by_rank is not None and len(by_rank):
        worst = by_rank.sort_values("rel_l2", ascending=False).iloc[0]
        rank = int(worst["rank"])
        text += f"; by rank, rank {rank} differs most (rel_l2 {float(worst['rel_l2']):.2e})"
    elif f is not None and res.grouping != "logical":
        rank = int(f["rank"])
    if len(res.replicas):
        text += f"; {len(res.replicas)} replicated copie(s) disagree ({res.describe_replicas()[0]})"
    if tokens is not None:
        text += f"; {tokens.attrs['sentence']}"
    return text, {"diverged": f is not None, "grouping": res.grouping, "rank": rank,
                  "layer": None if f is None else int(f["layer"]), "replicas_disagree": int(len(res.replicas))}


def chunked_finding(res, *, tokens=None, steps=None) -> tuple[str, dict]:
    """Control against a run that chunks or batches differently, rows by (request, position);
    ``steps``: the same pair compared step with step (what that would claim)."""
    how = "(request, position)" if res.align == "tokens" else "step"
    n_ok = int((res.table["status"] == "ok").sum())
    text = (f"{res.candidate_arm} against {res.control_arm} (rows by {how}): {divergence_sentence(res)}, "
            f"{n_ok} keys compared")
    if len(res.only_control):
        text += f", {len(res.only_control)} only in the control"
    if tokens is not None:
        text += f"; {tokens.attrs['sentence']}"
    false = None
    if steps is not None:
        false = int(len(steps.divergent(include_missing=True)))
        text += f"; compared step with step, step 0 alone would show {false} false divergence(s) or unpaired key(s)"
    return text, {"diverged": res.first_divergence() is not None, "align": res.align, "keys": n_ok,
                  "only_control": int(len(res.only_control)), "steps_false_divergences": false}
