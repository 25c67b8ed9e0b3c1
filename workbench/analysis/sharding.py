"""Sharding arithmetic on one device: which tensor-parallel layout reproduces a run bit for bit.

A row-parallel projection over ``tp`` ranks is a split-K GEMM: the splits are the ranks (each
rank holds a contiguous ``K / tp`` slice of the reduction dim), the partials are what each rank
holds before the all-reduce, and the reduction order is the all-reduce's. A column-parallel
projection splits the output dim instead: every output element is still one reduction over all
of K, the same bits as on one rank. So, given a capture's inputs and weights, replaying each
projection with :func:`workbench.kernels.gemm.splitk_matmul` (``splits`` = 1 or ``tp``, partial
dtype and reduction order as knobs) and comparing bitwise with the captured outputs says how the
run was sharded, with no communication and on one device:

* ``none``: up and down both reproduced unsplit (TP1 arithmetic);
* ``down-only``: the down projection reproduced only as a ``tp``-way split (Megatron's MLP:
  column-parallel up, row-parallel down);
* ``up-only``: the up (and gate) projection reproduced only split over K;
* ``both``.

Bitwise reproduction needs the replay's per-rank arithmetic to be the run's: the torch backend
sums each slice in fp32 in k order (as the bundled hybrid decoder's projections do). A real
engine's per-rank GEMM (cuBLAS, CUTLASS) has its own blocking, so against an engine's dump the
table ranks hypotheses by distance instead, and :func:`reduction_replay` checks what does not
depend on the GEMM: the all-reduce of the partials each rank holds (order, the dtype the partials
travel in, and which rank's partial holds only bf16-representable values).

Example
-------
>>> rep = sharding_replay("captures/tp4-control", layer=0, step=0)      # doctest: +SKIP
>>> rep.layout, rep.finding                                             # doctest: +SKIP
('down-only', 'layer 0 step 0: down-only ...')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import pandas as pd
import torch

from workbench.analysis.splitk import _ranges
from workbench.capture.reader import Capture, open_capture
from workbench.errors import AnalysisError, KeyNotFoundError

__all__ = ["replay_projection", "projection_hypotheses", "reduction_replay", "sharding_replay", "ShardingReport",
           "DEFAULT_NAMES", "LAYOUT_WORDS", "parse_names", "replayable_layers", "sharding_summary", "sharding_finding"]

# the roles of a two-projection block (an MLP) and the bundled hybrid decoder's names for them
# (RecordSpec(mlp_detail=...)); another model's names go in ``names=``
DEFAULT_NAMES = {"input": "mlp/input", "gate": "mlp/gate", "up": "mlp/up", "act": "mlp/act",
                 "partial": "mlp/partial", "output": "mlp/output",
                 "w_gate": "mlp/w_gate", "w_up": "mlp/w_up", "w_down": "mlp/w_down"}
# projection -> (input role, weight role, output role)
_PROJECTIONS = {"gate": ("input", "w_gate", "gate"), "up": ("input", "w_up", "up"), "down": ("act", "w_down", "output")}
LAYOUT_WORDS = {
    "none": "no projection is split over K: the TP1 arithmetic",
    "down-only": "the down projection's K is split over the ranks (row-parallel down, column-parallel up: "
                 "Megatron's MLP)",
    "up-only": "the up/gate projections' K is split over the ranks; the down projection is whole",
    "both": "both the up/gate and the down projections' K are split over the ranks",
}


def _dtype_name(dt: torch.dtype) -> str:
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16", torch.float64: "fp64"}.get(dt, str(dt))


def replay_projection(x: torch.Tensor, w: torch.Tensor, *, ranks: int = 1, partial_dtype: str = "fp32",
                      order: str = "sequential", backend: str = "torch") -> torch.Tensor:
    """``x @ w.T`` with K split over ``ranks`` ranks on one device (fp32 result).

    Rank r holds the partial of K slice r (``K / ranks`` columns, summed in fp32), stored in
    ``partial_dtype``; the partials are reduced in fp32 in ``order`` ("sequential": rank 0 + rank 1
    + ..., as a fixed-order ring; "tree": pairwise). ``ranks=1`` is the unsharded projection.

    Parameters
    ----------
    x: ``[M, K]`` activations (any float dtype; computed in fp32)
    w: ``[N, K]`` weight (nn.Linear layout)
    """
    K = x.shape[-1]
    if ranks < 1 or K % ranks:
        raise AnalysisError(f"K={K} cannot be split over {ranks} ranks", key="ranks",
                            fix=f"pass a rank count that divides {K}")
    from workbench.kernels import gemm

    return gemm.splitk_matmul(x.float(), w.float(), splits=ranks, partial_dtype=partial_dtype, order=order,
                              out_dtype="fp32", backend=backend)


def _judge(replayed: torch.Tensor, captured: torch.Tensor) -> dict:
    y = captured.float() if captured.dtype != torch.float64 else captured
    r = replayed.to(captured.dtype).to(y.dtype)  # rounded as the run stored its output
    diff = (r.double() - y.double()).abs()
    ref = y.double().norm()
    return {"bitwise": bool(torch.equal(r, y)), "mismatched": int((r != y).sum()), "elements": int(y.numel()),
            "max_abs": float(diff.max()) if diff.numel() else 0.0,
            "rel_l2": float(diff.norm() / ref) if float(ref) > 0 else float(diff.norm())}


def projection_hypotheses(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, *, tp: int,
                          partial_dtypes: Sequence[str] = ("fp32", "bf16"),
                          orders: Sequence[str] = ("sequential", "tree"), name: str = "proj",
                          backend: str = "torch") -> pd.DataFrame:
    """Replay ``y = x w^T`` unsplit and split over ``tp`` ranks (each partial dtype and order);
    one row per hypothesis: ``projection, ranks, partial_dtype, order, bitwise, mismatched,
    elements, max_abs, rel_l2``, best first.

    ``x`` ``[..., K]`` and ``y`` ``[..., N]`` are flattened to rows; ``w`` is ``[N, K]`` (or ``[K, N]``,
    transposed when only that fits).
    """
    x2, y2 = x.reshape(-1, x.shape[-1]), y.reshape(-1, y.shape[-1])
    if x2.shape[0] != y2.shape[0]:
        raise AnalysisError(f"{name}: input has {x2.shape[0]} rows, output {y2.shape[0]}", key=name,
                            fix="pass the input and output of the same step and positions")
    K, N = x2.shape[1], y2.shape[1]
    if tuple(w.shape) != (N, K):
        if tuple(w.shape) == (K, N):
            w = w.t()
        else:
            raise AnalysisError(f"{name}: weight shape {tuple(w.shape)} fits neither [N={N}, K={K}] nor [K, N]",
                                key=name, fix="pass the weight of this projection (all ranks' shards rebuilt)")
    cases = [(1, "fp32", "sequential")]
    if tp > 1:
        for pd_ in partial_dtypes:
            for o in orders:
                if o == "tree" and tp <= 2:
                    continue  # two partials: tree and sequential are the same sum
                cases.append((tp, pd_, o))
    rows = []
    for ranks, pdt, order in cases:
        rep = replay_projection(x2, w, ranks=ranks, partial_dtype=pdt, order=order, backend=backend)
        rows.append({"projection": name, "ranks": ranks, "partial_dtype": pdt, "order": order, **_judge(rep, y2)})
    df = pd.DataFrame(rows)
    return df.sort_values(["bitwise", "mismatched", "max_abs"], ascending=[False, True, True], kind="stable") \
             .reset_index(drop=True)


def _representable(t: torch.Tensor) -> str:
    """The narrowest float dtype holding every value of ``t`` exactly (its partial was rounded to it)."""
    f = t.float()
    for name, dt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        if torch.isfinite(f).all() and torch.equal(f.to(dt).float(), f):
            return name
    return _dtype_name(t.dtype) if t.dtype != torch.float64 else ("fp32" if torch.equal(t.float().double(), t) else "fp64")


def reduction_replay(partials: Sequence[torch.Tensor], output: torch.Tensor, *,
                     partial_dtypes: Sequence[str] = ("fp32", "bf16"),
                     orders: Sequence[str] = ("sequential", "reverse", "tree")) -> tuple[pd.DataFrame, list[dict]]:
    """Replay the all-reduce of the partials each rank holds; which one gives ``output`` bitwise.

    Returns ``(table, ranks)``: one row per (partial dtype the partials travel in, order), best
    first; and per rank the narrowest dtype its partial is representable in (a rank whose partial
    is all bf16 values rounded it before the all-reduce, whatever its tensor's dtype says).
    """
    from workbench.kernels.gemm.torch_ref import reduce_partials
    from workbench.numerics.dtypes import torch_dtype

    if not partials:
        raise AnalysisError("no partials to reduce", key="partial", fix="pass one tensor per rank")
    shapes = {tuple(p.shape) for p in partials}
    if len(shapes) > 1 or tuple(output.shape) != next(iter(shapes)):
        raise AnalysisError(f"partials {sorted(shapes)} and output {tuple(output.shape)} differ in shape",
                            key="partial", fix="pass each rank's partial sum of the output (dims '... h[tp:partial]')")
    rows = []
    for pdt in partial_dtypes:
        held = [p.float().to(torch_dtype(pdt)) for p in partials]
        for order in orders:
            if order == "tree" and len(held) <= 2:
                continue
            seq = held[::-1] if order == "reverse" else held
            if order == "reverse" and len(held) == 1:
                continue
            red = reduce_partials(seq, "tree" if order == "tree" else "sequential")
            rows.append({"partial_dtype": pdt, "order": order, **_judge(red, output)})
    table = pd.DataFrame(rows).sort_values(["bitwise", "mismatched", "max_abs"], ascending=[False, True, True],
                                           kind="stable").reset_index(drop=True)
    ranks = [{"rank": r, "dtype": _dtype_name(p.dtype), "representable_in": _representable(p)}
             for r, p in enumerate(partials)]
    return table, ranks


@dataclass
class ShardingReport:
    """What :func:`sharding_replay` found for one (layer, step).

    layout: "none", "down-only", "up-only", "both", or None (no hypothesis reproduces a
        projection bitwise: see ``table`` for the closest)
    table: every hypothesis of every projection (see :func:`projection_hypotheses`)
    reductions: the all-reduce replays from the captured partials (empty without partials)
    ranks: per rank, the dtype its partial is representable in
    finding: the answer in words
    """

    layer: int
    step: int
    tp: int
    layout: str | None
    table: pd.DataFrame
    reductions: pd.DataFrame = field(default_factory=pd.DataFrame)
    ranks: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    finding: str = ""

    def split_of(self, projection: str) -> str | None:
        """How a projection reproduces: "whole", "split" (K over the ranks), "either", or None."""
        t = self.table[(self.table["projection"] == projection) & self.table["bitwise"]]
        if t.empty:
            return None
        whole, split = (t["ranks"] == 1).any(), (t["ranks"] > 1).any()
        return "either" if whole and split else "whole" if whole else "split"


def _key(spec: str) -> tuple[str, str]:
    op, sep, name = spec.rpartition("/")
    if not sep or not op or not name:
        raise AnalysisError(f"tensor name {spec!r} is not 'op/name'", key=spec, fix="write e.g. 'mlp/output'")
    return op, name


def _logical(view, op: str, name: str, layer: int, step: int, weight: bool):
    """The logical tensor of a role: of ``step`` (an activation), or of the earliest step holding
    it (a weight, recorded once)."""
    sel = view.select(op=op, name=name, layer=layer)
    if not len(sel):
        return None
    sel = sel.select(step=int(sel.index["step"].min()) if weight else step)
    if len(sel) != 1:
        return None
    return sel.tensor(sel.index.iloc[0])


def _rank_tensors(cap: Capture, op: str, name: str, layer: int, step: int) -> list[torch.Tensor]:
    rows = cap.index[(cap.index["op"] == op) & (cap.index["name"] == name) & (cap.index["layer"] == layer)
                     & (cap.index["step"] == step)].sort_values("rank")
    return [torch.as_tensor(cap._tensor(r)) for _, r in rows.iterrows()]


def _tp_of(cap: Capture, op: str) -> int:
    par = (cap.run or {}).get("parallel") or {}
    for k in ("tp_size", "tp"):
        if isinstance(par.get(k), int) and par[k] > 0:
            return int(par[k])
    arm = (cap.run or {}).get("arm") or {}
    if isinstance(arm, dict) and isinstance(arm.get("tp"), int):
        return int(arm["tp"])
    rows = cap.index[cap.index["op"] == op]
    return max(1, int(rows["rank"].nunique()))


def sharding_replay(capture, *, layer: int, step: int = 0, tp: int | None = None,
                    names: Mapping[str, str] | None = None, partial_dtypes: Sequence[str] = ("fp32", "bf16"),
                    orders: Sequence[str] = ("sequential", "tree"), backend: str = "torch") -> ShardingReport:
    """Replay a two-projection block (an MLP: gate/up, activation, down) of one (layer, step) on
    one device, unsplit and split over ``tp`` ranks, and say which sharding reproduces the capture.

    Each projection is judged on its own captured input and output (the up/gate projections on the
    block input and their pre-activation outputs, the down projection on the activation and the
    block output), so no activation function is recomputed. Per-rank tensors with ``dims`` specs
    are rebuilt into logical tensors first (:class:`~workbench.capture.logical.LogicalCapture`).

    Parameters
    ----------
    capture: a capture or its path
    layer, step: the block to replay (weights are read from the earliest step that holds them)
    tp: ranks to split over (default: the capture's ``run["parallel"]["tp_size"]``, its arm's
        ``tp``, else the number of ranks holding the block's tensors)
    names: role -> ``"op/name"`` for the roles of :data:`DEFAULT_NAMES` that the capture names
        otherwise (input, gate, up, act, partial, output, w_gate, w_up, w_down); a role the
        capture lacks leaves its projection out (listed in ``notes``)
    partial_dtypes, orders: the knobs tried for every split
    """
    from workbench.capture.logical import LogicalCapture

    cap = capture if isinstance(capture, Capture) else open_capture(capture)
    roles = {**DEFAULT_NAMES, **dict(names or {})}
    unknown = sorted(set(names or {}) - set(DEFAULT_NAMES))
    if unknown:
        raise AnalysisError(f"unknown role(s) {unknown}", key="names", fix=f"name roles among {sorted(DEFAULT_NAMES)}")
    keys = {r: _key(s) for r, s in roles.items()}
    # only this layer's tensors of the roles' ops are rebuilt (a whole capture's groups cost seconds)
    view = LogicalCapture(cap.select(layer=layer, op=sorted({op for op, _ in keys.values()})))
    got: dict[str, torch.Tensor | None] = {}
    for role, (op, name) in keys.items():
        got[role] = _logical(view, op, name, layer, step, weight=role.startswith("w_"))
    if tp is None:
        tp = _tp_of(cap, keys["output"][0])
    tables, notes = [], []
    for proj, (xi, wi, yi) in _PROJECTIONS.items():
        miss = [roles[r] for r in (xi, wi, yi) if got[r] is None]
        if miss:
            notes.append(f"{proj} projection not replayed: the capture has no {', '.join(miss)} at layer {layer} "
                         f"step {step}")
            continue
        tables.append(projection_hypotheses(got[xi], got[wi], got[yi], tp=tp, partial_dtypes=partial_dtypes,
                                            orders=orders, name=proj, backend=backend))
    reductions, ranks = pd.DataFrame(), []
    pop, pname = keys["partial"]
    parts = _rank_tensors(cap, pop, pname, layer, step)
    if len(parts) > 1 and got["output"] is not None:
        reductions, ranks = reduction_replay(parts, got["output"], partial_dtypes=partial_dtypes,
                                             orders=("sequential", "reverse", *(o for o in orders if o == "tree")))
    if not tables and reductions.empty:
        have = sorted({f"{o}/{n}" for o, n in cap.index[cap.index["layer"] == layer][["op", "name"]]
                       .itertuples(index=False)})
        raise KeyNotFoundError(f"no projection of layer {layer} step {step} can be replayed: " + "; ".join(notes),
                               file=cap.path, key=f"layer={layer} step={step}",
                               fix=f"record the block's inputs, outputs and weights, or map the roles with "
                                   f"names= (the layer holds {have[:12]})")
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(
        columns=["projection", "ranks", "partial_dtype", "order", "bitwise", "mismatched", "elements", "max_abs", "rel_l2"])
    rep = ShardingReport(layer=layer, step=step, tp=tp, layout=None, table=table, reductions=reductions, ranks=ranks,
                         notes=notes)
    rep.layout = _layout(rep)
    rep.finding = _finding(rep)
    return rep


def _layout(rep: ShardingReport) -> str | None:
    ups = [rep.split_of(p) for p in ("gate", "up") if (rep.table["projection"] == p).any()]
    down = rep.split_of("down") if (rep.table["projection"] == "down").any() else None
    if rep.table.empty or not ups or down is None or None in ups or "either" in ups + [down]:
        return None
    if len(set(ups)) > 1:
        return None
    up_split, down_split = ups[0] == "split", down == "split"
    return {(False, False): "none", (False, True): "down-only", (True, False): "up-only", (True, True): "both"}[
        (up_split, down_split)]


def _best(t: pd.DataFrame) -> str:
    r = t.iloc[0]
    how = "unsplit" if r["ranks"] == 1 else f"split over {r['ranks']} ranks, {r['partial_dtype']} partials, {r['order']}"
    verdict = "bitwise" if r["bitwise"] else f"closest, {r['mismatched']}/{r['elements']} values differ, max_abs {r['max_abs']:.3g}"
    return f"{how} ({verdict})"


def _finding(rep: ShardingReport) -> str:
    head = f"layer {rep.layer} step {rep.step}, tp={rep.tp}: "
    if rep.table.empty:
        per = "no projection replayed (" + "; ".join(rep.notes) + ")"
    else:
        per = "; ".join(f"{p} {_best(rep.table[rep.table['projection'] == p])}"
                        for p in dict.fromkeys(rep.table["projection"]))
    if rep.table.empty:
        out = head + per
    elif rep.layout is not None:
        out = head + f"{rep.layout} reproduces the run bitwise ({LAYOUT_WORDS[rep.layout]}); " + per
    else:
        amb = [p for p in dict.fromkeys(rep.table["projection"]) if rep.split_of(p) == "either"]
        why = (f"{', '.join(amb)} reproduce both unsplit and split (the data cannot tell)" if amb
               else "no sharding reproduces every projection bitwise")
        out = head + f"layout undetermined: {why}; " + per
    if not rep.reductions.empty:
        r = rep.reductions.iloc[0]
        if rep.table.empty:
            out = head.rstrip(": ") + ": projections not replayed (no weights or inputs)"
        odd = [f"rank {d['rank']}" for d in rep.ranks if d["representable_in"] in ("bf16", "fp16")
               and d["dtype"] not in ("bf16", "fp16")]
        out += (f"; all-reduce of the ranks' partials: {r['order']} in {r['partial_dtype']} "
                + ("reproduces the output bitwise" if r["bitwise"] else f"is closest (max_abs {r['max_abs']:.3g})"))
        if odd:
            out += f"; {', '.join(odd)} hold{'s' if len(odd) == 1 else ''} a partial of bf16 values only (rounded before the all-reduce)"
    return out


def parse_names(text: str) -> dict[str, str]:
    """``"input=ffn/x w_down=ffn/w2"`` (or ``role:op/name``) -> ``{"input": "ffn/x", "w_down":
    "ffn/w2"}`` (roles of :data:`DEFAULT_NAMES`; empty text: no change)."""
    out = {}
    for part in str(text or "").replace(",", " ").split():
        role, sep, spec = part.partition("=") if "=" in part else part.partition(":")
        if not sep or role not in DEFAULT_NAMES:
            raise AnalysisError(f"{part!r} is not role=op/name with a role of {sorted(DEFAULT_NAMES)}", key="names",
                                fix="write e.g. 'input=ffn/input w_down=ffn/w2'")
        _key(spec)
        out[role] = spec
    return out


def replayable_layers(capture, names: Mapping[str, str] | None = None) -> list[int]:
    """Layers whose block can be replayed: they hold the down projection's weight and input, or
    the per-rank partials (with the roles' names, :data:`DEFAULT_NAMES` unless given)."""
    cap = capture if isinstance(capture, Capture) else open_capture(capture)
    roles = {**DEFAULT_NAMES, **dict(names or {})}
    idx = cap.index
    have = lambda role: set(idx[(idx["op"] == _key(roles[role])[0]) & (idx["name"] == _key(roles[role])[1])]["layer"])
    layers = (have("w_down") & have("act")) | (have("w_up") & have("input")) | (have("partial") & have("output"))
    return sorted(int(x) for x in layers)


def sharding_summary(reports: Sequence[ShardingReport]) -> pd.DataFrame:
    """One row per report: layer, step, tp, layout and how each projection reproduces."""
    rows = []
    for r in reports:
        row = {"layer": r.layer, "step": r.step, "tp": r.tp, "layout": r.layout or "undetermined"}
        for p in ("gate", "up", "down"):
            if (r.table["projection"] == p).any():
                row[p] = r.split_of(p) or "not reproduced"
        if not r.reductions.empty:
            row["all-reduce"] = (f"{r.reductions.iloc[0]['order']} {r.reductions.iloc[0]['partial_dtype']}"
                                 + ("" if r.reductions.iloc[0]["bitwise"] else " (closest)"))
        rows.append(row)
    return pd.DataFrame(rows)


def sharding_finding(arm: str, reports: Sequence[ShardingReport]) -> tuple[str, dict]:
    """One sentence for an arm's replays over several layers: the layout of each group of layers,
    the first layer's detail, and every layer where a rank's partial holds only bf16 values or the
    all-reduce is not reproduced."""
    if not reports:
        return f"{arm}: nothing replayed", {"arm": arm, "layouts": {}}
    groups: dict[str, list[int]] = {}
    for r in reports:
        groups.setdefault(r.layout or ("undetermined" if not r.table.empty else "all-reduce replayed only"),
                          []).append(r.layer)
    head = "; ".join(f"{lay} at layer{'s' if len(ls) > 1 else ''} {_ranges(sorted(ls))}" for lay, ls in groups.items())
    first = reports[0]
    text = (f"{arm} (step {first.step}, tp={first.tp}): {head}. Layer {first.layer}: "
            + first.finding.split(": ", 1)[-1])
    odd = []
    for r in reports:
        ranks = [d["rank"] for d in r.ranks if d["representable_in"] in ("bf16", "fp16") and d["dtype"] not in ("bf16", "fp16")]
        if ranks:
            odd.append(f"layer {r.layer}: rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} "
                       f"hold{'s' if len(ranks) == 1 else ''} a partial of bf16 values only")
        if not r.reductions.empty and not bool(r.reductions.iloc[0]["bitwise"]):
            odd.append(f"layer {r.layer}: no all-reduce order reproduces the output from the ranks' partials")
    if odd and len(reports) > 1:
        text += ". " + "; ".join(odd)
    return text, {"arm": arm, "layouts": {k: v for k, v in groups.items()},
                  "bf16_partials": [o for o in odd if "bf16" in o]}
