"""compare_captures: pair two captures key by key and find the first divergence in causal order."""

from __future__ import annotations

import fnmatch
import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from workbench.capture.format import DTYPES, KEY_FIELDS, NUMPY_DTYPES as DTYPES_NP
from workbench.capture.align import BATCH_OP, AlignedView, align_tokens
from workbench.capture.logical import LogicalCapture, same_layout
from workbench.capture.reader import Capture, open_capture
from workbench.errors import WorkbenchError
from workbench.numerics.metrics import FIELDS, compare

__all__ = ["Rule", "DEFAULT_RULE", "ComparisonResult", "compare_captures", "METRICS", "GROUPINGS"]

GROUPINGS = ("auto", "logical", "raw")
ALIGNS = ("auto", "tokens", "steps")

# metrics where a larger value means "further apart"
METRICS = ("rel_l2", "max_abs", "mean_abs", "max_ulp", "median_ulp", "frac_outside")
DIVERGENT_STATUSES = ("diverged", "shape_mismatch", "nonfinite")
RELATIVE_METRICS = ("rel_l2",)


@dataclass(frozen=True)
class Rule:
    """Threshold rule for the tensors whose ``op/name`` matches ``pattern`` (fnmatch glob).

    A key diverges when ``metric > threshold``. Without an A/A capture, ``threshold`` is used
    as is. With an A/A capture, the threshold of each key is ``max(aa_factor * noise, floor)``,
    where noise is the same metric between the control and its repeat for that key; keys the
    repeat lacks fall back to ``threshold``.

    The pattern is matched against ``"op/name"`` and ``"layer<L>/op/name"``, so
    ``"lm_head/*"``, ``"*/state"`` and ``"layer3/*"`` all work. The first matching rule wins.
    """

    pattern: str = "*"
    metric: str = "rel_l2"
    threshold: float = 1e-3
    aa_factor: float = 4.0
    floor: float = 0.0

    def __post_init__(self) -> None:
        if self.metric not in METRICS:
            raise WorkbenchError(f"Rule.metric must be one of {list(METRICS)}, got {self.metric!r}",
                                 key="metric", fix=f"use one of {list(METRICS)}")
        if not isinstance(self.pattern, str) or not self.pattern:
            raise WorkbenchError(f"Rule.pattern must be a non-empty glob, got {self.pattern!r}", key="pattern",
                                 fix="pass e.g. 'lm_head/*' or '*'")
        for f in ("threshold", "aa_factor", "floor"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise WorkbenchError(f"Rule.{f} must be a finite number >= 0, got {v!r} (rule {self.pattern!r})",
                                     key=f, fix=f"pass {f}= a finite non-negative number; a NaN or infinite "
                                                "threshold would silently disable the check")

    def matches(self, op: str, name: str, layer: int) -> bool:
        return fnmatch.fnmatchcase(f"{op}/{name}", self.pattern) or \
            fnmatch.fnmatchcase(f"layer{layer}/{op}/{name}", self.pattern)


DEFAULT_RULE = Rule()
# integer tensors under the default rule: exact (max_ulp of integers is the largest |a - b|)
EXACT_RULE = Rule(metric="max_ulp", threshold=0.0)
INTEGER_DTYPES = tuple(n for n, (t, _, _) in DTYPES.items() if not t.is_floating_point)


def _as_rules(rules) -> list[Rule]:
    if rules is None:
        return []
    if isinstance(rules, (Rule, dict)):
        rules = [rules]
    out = []
    for r in rules:
        if isinstance(r, Rule):
            out.append(r)
        elif isinstance(r, dict):
            try:
                out.append(Rule(**r))
            except TypeError as e:
                raise WorkbenchError(f"bad rule {r!r}: {e}", key="rules",
                                     fix="rules are dicts with pattern, metric, threshold, aa_factor, floor") from None
        else:
            raise WorkbenchError(f"a rule must be a Rule or dict, got {type(r).__name__}", key="rules",
                                 fix="pass rules=[Rule('lm_head/*', threshold=1e-2), ...]")
    return out


def _open(c, verify: bool = False) -> Capture:
    return c if isinstance(c, Capture) else open_capture(c, verify=verify)


class ComparisonResult:
    """Per-key comparison of a control and a candidate capture.

    Attributes
    ----------
    table: pandas DataFrame, one row per key (causal order of the control, keys only in the
        candidate last): key fields, seq, status, every metric of :func:`workbench.compare`,
        ``aa`` (A/A noise of the rule's metric), ``metric``, ``value``, ``threshold``,
        ``exceeded``.
    """

    def __init__(self, table: pd.DataFrame, *, control: Capture, candidate: Capture,
                 aa: Capture | None, rules: list[Rule]) -> None:
        self.table = table
        self.control_path = str(control.path)
        self.candidate_path = str(candidate.path)
        self.aa_path = str(aa.path) if aa is not None else None
        self.control_arm = control.arm
        self.candidate_arm = candidate.arm
        self.rules = rules
        self.grouping = "raw"  # or "logical": tensors rebuilt from their ranks (compare_captures sets it)
        self.replicas = pd.DataFrame(columns=["arm", "step", "layer", "op", "name", "rank", "axis", "coordinate",
                                              "max_abs"])  # replicated copies that disagree (logical grouping)
        self.layout_notes: list[str] = []  # groups a logical comparison kept rank by rank, and why
        self.align = "steps"  # or "tokens": the candidate's rows rebuilt on the control's steps by (request, position)
        self.align_notes: list[str] = []  # candidate rows no control row asked for

    def by_rank(self, key=None) -> pd.DataFrame:
        """Which rank's piece of a logical tensor differs (logical grouping): for ``key`` (a dict
        or table row; default the first divergence), one row per rank of the candidate with the
        metrics of its piece against the control's matching piece (the control's own piece when
        both arms hold the same layout, else the slice of the control's tensor that rank holds).
        Partial sums cannot be taken apart against an unsharded control: an empty table whose
        attrs ``reason`` says so."""
        views = getattr(self, "_views", None)
        if views is None:
            raise WorkbenchError("by_rank needs a logical comparison", key="grouping",
                                 fix="compare with grouping='logical' (a raw comparison names the rank already)")
        if key is None:
            key = self.first_divergence()
            if key is None:
                return pd.DataFrame(columns=["rank", "coordinate", "rel_l2", "max_abs"])
        sel = {f: (int(key[f]) if f in ("step", "layer") else str(key[f])) for f in ("step", "layer", "op", "name")}
        aligned = getattr(self, "_aligned", None)
        if aligned is not None and not aligned.same_rows((0, sel["step"], sel["layer"], sel["op"], sel["name"])):
            out = pd.DataFrame(columns=["rank", "coordinate", "rel_l2", "max_abs"])
            out.attrs["reason"] = ("the candidate's rows of this key come from other steps (token alignment): "
                                   "compare its ranks at their own step with align='steps'")
            return out
        rows = []
        for v in views:
            view = v.select(**sel)
            rows.append(view.index.iloc[0] if len(view) == 1 else None)
        out = pd.DataFrame(columns=["rank", "coordinate", "rel_l2", "max_abs"])
        if rows[0] is None or rows[1] is None or rows[1]["_plan"] is None or not rows[1]["_plan"][0]:
            out.attrs["reason"] = "the candidate's tensor is not rebuilt from several ranks"
            return out
        c_axes, c_coords, c_dims = rows[1]["_plan"]
        src = [views[1].cap.index.loc[i] for i in rows[1]["_rows"]]
        ctl_plan = rows[0]["_plan"]
        same = ctl_plan is not None and list(ctl_plan[0]) == list(c_axes) and list(ctl_plan[1]) == list(c_coords)
        if not same and c_dims is not None and c_dims.partial_axes():
            out.attrs["reason"] = ("partial sums over " + ",".join(c_dims.partial_axes())
                                   + " cannot be taken apart against a control of another layout")
            return out
        from workbench.capture.dims import shard_of

        whole = None if same else views[0].tensor(rows[0])
        sizes = {a: len({c[i] for c in c_coords}) for i, a in enumerate(c_axes)}
        recs = []
        for j, (coord, r) in enumerate(zip(c_coords, src)):
            mine = views[1].cap._tensor(r)
            if same:
                ref = views[0].cap._tensor(views[0].cap.index.loc[rows[0]["_rows"][j]])
            else:
                ref = shard_of(whole, c_dims, sizes, dict(zip(c_axes, coord))) if c_dims is not None else whole
            res = compare(ref, mine)
            recs.append({"rank": int(r["rank"]), "coordinate": " ".join(f"{a}={c}" for a, c in zip(c_axes, coord)),
                         "rel_l2": float(res.rel_l2), "max_abs": float(res.max_abs)})
        out = pd.DataFrame(recs, columns=out.columns)
        out.attrs["reason"] = "pieces compared rank by rank" if same else "candidate pieces against the control's slices"
        return out

    def describe_replicas(self) -> list[str]:
        """One sentence per replicated copy that disagrees with the lowest rank's (logical grouping)."""
        return [f"{r.arm}: step {r.step}, layer {r.layer}, {r.op}/{r.name}: rank {r.rank} ({r.axis} {r.coordinate}) "
                f"differs from its replicas by up to {r.max_abs:.3e}" for r in self.replicas.itertuples()]

    # -- queries -----------------------------------------------------------------------------
    def divergent(self, *, include_missing: bool = False) -> pd.DataFrame:
        """Rows beyond their threshold (and structural mismatches), in causal order."""
        m = self.table["exceeded"].to_numpy(dtype=bool, copy=True)
        if include_missing:
            m |= self.table["status"].isin(["only_control", "only_candidate"]).to_numpy()
        return self.table[m]

    def first_divergence(self, *, include_missing: bool = False) -> pd.Series | None:
        """The first key in causal order whose error exceeds its threshold, or None."""
        d = self.divergent(include_missing=include_missing)
        return None if len(d) == 0 else d.iloc[0]

    @property
    def only_control(self) -> pd.DataFrame:
        return self.table[self.table["status"] == "only_control"]

    @property
    def only_candidate(self) -> pd.DataFrame:
        return self.table[self.table["status"] == "only_candidate"]

    @property
    def same_keys(self) -> bool:
        """True when every key is in both arms."""
        return len(self.only_control) == 0 and len(self.only_candidate) == 0

    def describe_missing(self, limit: int = 3) -> list[str]:
        """One sentence per arm that lacks keys of the other (a finding, not an error)."""
        out = []
        for rows, have, lack in ((self.only_control, "control", "candidate"),
                                 (self.only_candidate, "candidate", "control")):
            if len(rows):
                first = "; ".join(" ".join(f"{f}={r[f]}" for f in KEY_FIELDS)
                                  for _, r in rows.head(limit).iterrows())
                more = f"; ... {len(rows) - limit} more" if len(rows) > limit else ""
                out.append(f"{len(rows)} key(s) only in the {have}, missing from the {lack}: {first}{more}")
        return out

    def counts(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.table["status"].value_counts().items()}

    def to_xarray(self) -> xr.Dataset:
        """The table as an xarray Dataset along dim ``key`` (causal order) with the key fields
        and seq as coordinates, every metric as a variable, and the first divergence in attrs
        (``first_found`` 0/1, ``first_rank``, ``first_step``, ``first_layer``, ``first_op``,
        ``first_name``, ``first_seq``, ``first_value``, ``first_threshold``, ``first_metric``,
        ``first_status``; ``first_divergence``: one sentence). Its questions are methods of
        ``ds.div`` (:class:`~workbench.analysis.accessors.DivergenceAccessor`)."""
        t = self.table.reset_index(drop=True)
        coords = {f: ("key", t[f].to_numpy()) for f in (*KEY_FIELDS, "seq")}
        data = {c: ("key", t[c].to_numpy()) for c in t.columns
                if c not in coords and c not in ("shape", "shape_candidate", "max_abs_index")}
        ds = xr.Dataset(data, coords=coords)
        ds.attrs.update(control=self.control_path, candidate=self.candidate_path,
                        aa=self.aa_path or "", control_arm=self.control_arm,
                        candidate_arm=self.candidate_arm, grouping=self.grouping,
                        rules=json.dumps([asdict(r) for r in self.rules]),
                        first_divergence=self.describe_first(), **self._first_attrs())
        return ds

    def _first_attrs(self) -> dict[str, Any]:
        fd = self.first_divergence()
        if fd is None:
            return {"first_found": 0}
        return {"first_found": 1, **{f"first_{f}": (int(fd[f]) if f in ("rank", "step", "layer") else str(fd[f]))
                                     for f in KEY_FIELDS},
                "first_seq": int(fd["seq"]), "first_value": float(fd["value"]),
                "first_threshold": float(fd["threshold"]), "first_metric": str(fd["metric"]),
                "first_status": str(fd["status"])}

    def to_dict(self) -> dict[str, Any]:
        fd = self.first_divergence()
        rows = json.loads(self.table.to_json(orient="records"))
        return {
            "control": self.control_path, "candidate": self.candidate_path, "aa": self.aa_path,
            "rules": [asdict(r) for r in self.rules], "counts": self.counts(),
            "first_divergence": None if fd is None else json.loads(fd.to_json()),
            "same_keys": self.same_keys, "missing": self.describe_missing(),
            "rows": rows,
        }

    # -- text ----------------------------------------------------------------------------------
    def describe_first(self) -> str:
        fd = self.first_divergence()
        if fd is None:
            return "no divergence beyond the thresholds"
        key = " ".join(f"{f}={fd[f]}" for f in KEY_FIELDS)
        if fd["status"] == "shape_mismatch":
            return f"first divergence: {key} (seq {fd['seq']}): shape {fd['shape']} vs {fd['shape_candidate']}"
        return (f"first divergence: {key} (seq {fd['seq']}): {fd['metric']}={fd['value']:.3e} > "
                f"threshold {fd['threshold']:.3e}" + (f" (A/A noise {fd['aa']:.3e})" if not math.isnan(fd["aa"]) else "")
                + f" [{fd['status']}]")

    def report(self, *, rows: int = 20) -> str:
        """A readable table: the keys up to the first divergence (and a few after), then a verdict."""
        t = self.table
        cols = [*KEY_FIELDS, "seq", "status", "rel_l2", "max_abs", "max_ulp", "aa", "threshold"]
        if self.grouping == "logical":
            cols.append("layout_candidate")
        fd = self.first_divergence()
        if fd is not None:
            pos = int(np.flatnonzero(t.index == fd.name)[0])
            lo = max(0, pos - rows // 2)
            view = t.iloc[lo: lo + rows]
        else:
            view = t.iloc[:rows]
        with pd.option_context("display.width", 200, "display.max_columns", 20,
                               "display.float_format", "{:.3e}".format):
            body = view[cols].to_string(index=False)
        c = self.counts()
        head = (f"control   {self.control_path} (arm {self.control_arm})\n"
                f"candidate {self.candidate_path} (arm {self.candidate_arm})\n"
                + (f"A/A       {self.aa_path}\n" if self.aa_path else "")
                + f"grouping: {self.grouping}" + (" (logical tensors rebuilt from their ranks; rank 0 is the logical "
                                                  "tensor)" if self.grouping == "logical" else " (rank by rank)") + "\n"
                + f"keys: {len(t)}  " + "  ".join(f"{k}={v}" for k, v in sorted(c.items())))
        more = f"\n... {len(t) - len(view)} more rows" if len(t) > len(view) else ""
        missing = "".join(f"\n{line}" for line in self.describe_missing())
        extra = ""
        if self.align == "tokens":
            extra += "\naligned by (request, position) on the control's steps" + "".join(
                f"\n{n}" for n in self.align_notes)
        if self.grouping == "logical":
            extra += "".join(f"\nreplica disagrees: {line}" for line in self.describe_replicas())
            notes = self.layout_notes
            extra += "".join(f"\nkept rank by rank: {n}" for n in notes[:10])
            extra += f"\n... {len(notes) - 10} more groups kept rank by rank" if len(notes) > 10 else ""
            if fd is not None:
                br = self.by_rank()
                extra += ("\nby rank: " + "; ".join(f"rank {r.rank} ({r.coordinate}) rel_l2={r.rel_l2:.3e}"
                                                    for r in br.itertuples())) if len(br) else \
                    f"\nby rank: {br.attrs.get('reason', 'not attributable')}"
        return f"{head}\n\n{body}{more}\n\n{self.describe_first()}{missing}{extra}"

    def __repr__(self) -> str:
        return f"<ComparisonResult keys={len(self.table)} {self.describe_first()}>"


def _rule_for(rules: list[Rule], op: str, name: str, layer: int) -> Rule:
    for r in rules:
        if r.matches(op, name, layer):
            return r
    return DEFAULT_RULE


def compare_captures(control, candidate, *, aa=None, rules=None, dtype=None,
                     atol: float = 1e-5, rtol: float = 1e-3, verify: bool = False, grouping: str = "auto",
                     align: str = "auto", client=None, partition=None, **filters) -> ComparisonResult:
    """Compare every tensor key of two captures.

    Parameters
    ----------
    control, candidate: Capture or capture paths
    aa: an A/A repeat of the control (Capture or path): per-key noise thresholds
    rules: Rule / dict / list of them: per-tensor thresholds by ``op/name`` pattern
    dtype: ULP format (default: the coarser stored format of each pair)
    atol, rtol: the "outside" tolerance reported as ``frac_outside``
    verify: open capture paths with checksum-on-read (each shard's sha256 checked at its first read)
    grouping: "logical" compares logical tensors, each rebuilt from its ranks with its ``dims``
        spec (:class:`~workbench.capture.logical.LogicalCapture`: TP1 against TP2/4/8, CP...);
        "raw" compares rank with rank; "auto" (default) is raw when the arms have the same layout
        (ranks, their coordinates and the tensors' dims specs: rank by rank names the rank) and
        logical when they do not
    align: "tokens" rebuilds the candidate's (and the A/A repeat's) token rows on the control's
        steps by (request, position) (:mod:`workbench.capture.align`: chunked against unchunked
        prefill, a request alone against the same request in a batch); "steps" pairs step with
        step; "auto" (default) aligns tokens when every capture records its batch rows
        (``CaptureWriter.add_batch``)
    client: a ``dask.distributed.Client``: the keys are compared on its workers, partitioned
        (by default by rank and step, see ``partition``) so that each task reads only its own
        tensors' bytes from the captures (which every worker must reach at the same path: a shared
        filesystem); the table is the one a local run gives, row for row. See docs/scale.md.
    partition: with ``client``, the key fields whose values make one task (default
        ``("rank", "step")``; ``"shard"`` groups by the control's shard file instead)
    filters: restrict both captures as :meth:`Capture.select` does (e.g. ``op="gdn"``)

    Returns
    -------
    ComparisonResult; ``.first_divergence()`` is the first key in causal (seq) order beyond its
    threshold. Missing keys, shape and dtype mismatches are rows with a status, never errors
    (``.same_keys`` and ``.describe_missing()`` report the keys only one arm holds). A key whose
    control is all zeros is judged by ``max_abs`` where its rule says ``rel_l2`` (the relative
    error of a zero reference is 0 or infinite), and an A/A threshold that is not finite falls
    back to the rule's threshold. Integer and bool tensors are compared exactly: with no rule of
    their own, any changed value diverges (beyond the A/A repeat's, if one is given).
    """
    rl = _as_rules(rules)
    ctl, cand = _open(control, verify), _open(candidate, verify)
    rep = _open(aa, verify) if aa is not None else None
    if grouping not in GROUPINGS:
        raise WorkbenchError(f"grouping must be one of {list(GROUPINGS)}, got {grouping!r}", key="grouping",
                             fix="pass grouping='logical' (rebuild tensors from their ranks) or 'raw' (rank by rank)")
    if grouping == "auto":  # rank by rank where the layouts match (it names the rank); logical where not
        arms = [c for c in (ctl, cand, rep) if c is not None]
        grouping = "raw" if same_layout(arms) else "logical"
    if grouping == "logical":
        ctl, cand = LogicalCapture(ctl), LogicalCapture(cand)
        rep = LogicalCapture(rep) if rep is not None else None
    if align not in ALIGNS:
        raise WorkbenchError(f"align must be one of {list(ALIGNS)}, got {align!r}", key="align",
                             fix="pass align='tokens' (by request and position) or 'steps' (step with step)")
    if align == "auto":
        arms = [c for c in (ctl, cand, rep) if c is not None]
        align = "tokens" if all((c.index["op"] == BATCH_OP).any() for c in arms) else "steps"
    align_notes: list[str] = []
    if align == "tokens":
        pair = align_tokens(ctl, cand)
        cand, align_notes, skip = pair.candidate, [f"{cand.arm}: {n}" for n in pair.notes], set(pair.skipped)
        if rep is not None:
            pa = align_tokens(ctl, rep)
            rep, align_notes = pa.candidate, align_notes + [f"{rep.arm}: {n}" for n in pa.notes]
        ctl = ctl.select(op=lambda o: o != BATCH_OP)
        if skip:  # keys whose rows cannot be paired are left out (said in align_notes), not failed
            keep = [tuple(k) not in skip for k in ctl.index[list(KEY_FIELDS)].itertuples(index=False, name=None)]
            ctl = _subset(ctl, np.asarray(keep, dtype=bool))
            ci = cand.index
            cand = AlignedView(cand.base, ci[[tuple(k) not in skip for k in ci[list(KEY_FIELDS)].itertuples(
                index=False, name=None)]].reset_index(drop=True), cand._plans)
    if filters:
        ctl, cand = ctl.select(**filters), cand.select(**filters)
        rep = rep.select(**filters) if rep is not None else None
    keys = list(KEY_FIELDS)
    left = _stored_dtype(ctl.index).assign(c_pos=np.arange(len(ctl.index)))
    right = _stored_dtype(cand.index)[keys + ["seq", "dtype", "shape"]].assign(d_pos=np.arange(len(cand.index)))
    m = left.merge(right, on=keys, how="outer", suffixes=("", "_candidate"), sort=False)
    aa_pos = None
    if rep is not None:
        aa_idx = rep.index[keys].assign(a_pos=np.arange(len(rep.index)))
        aa_pos = m[keys].merge(aa_idx, on=keys, how="left")["a_pos"].to_numpy()
    table = _judge(m, aa_pos, ctl, cand, rep, rl, dtype, atol, rtol, client=client, partition=partition)
    if grouping == "logical":
        for col, c in (("layout", ctl), ("layout_candidate", cand)):  # how each arm's tensor was rebuilt
            layout = {tuple(r[:5]): r[5] for r in c.index[keys + ["layout"]].itertuples(index=False)}
            table[col] = [layout.get(k, "") for k in table[keys].itertuples(index=False, name=None)]
    res = ComparisonResult(table, control=ctl, candidate=cand, aa=rep, rules=rl)
    res.grouping, res.align, res.align_notes = grouping, align, align_notes
    if grouping == "logical" and isinstance(cand, LogicalCapture):
        res._views = (ctl, cand)
    elif grouping == "logical" and isinstance(cand, AlignedView) and isinstance(cand.base, LogicalCapture):
        res._views, res._aligned = (ctl, cand.base), cand  # by_rank reads a key whose rows alignment kept
    if grouping == "logical":
        res.replicas = pd.DataFrame([{"arm": c.arm, **r} for c in (ctl, cand, rep) if c is not None for r in c.replicas],
                                    columns=["arm", "step", "layer", "op", "name", "rank", "axis", "coordinate", "max_abs"])
        # in key order, however the tensors were read (one process or many)
        res.replicas = res.replicas.sort_values(["arm", "step", "layer", "op", "name", "rank", "axis", "coordinate"],
                                                kind="stable").reset_index(drop=True)
        res.layout_notes = [f"{c.arm}: {n}" for c in (ctl, cand, rep) if c is not None for n in c.notes]
    return res


def _subset(c, mask: np.ndarray):
    """The capture or view ``c`` restricted to the index rows of ``mask``."""
    if isinstance(c, Capture):
        return Capture(c.path, verify=c.verify_on_read, _manifest=c._manifest,
                       _index=c.index[mask].reset_index(drop=True), _shared=c._shared)
    return LogicalCapture(c.cap, _index=c.index[mask].reset_index(drop=True), _shared=c._shared)


def _stored_dtype(index: pd.DataFrame) -> pd.DataFrame:
    """The index with the dtype the ranks stored (a logical tensor summed in fp64 reports its ranks' dtype)."""
    return index.assign(dtype=index["source_dtype"]) if "source_dtype" in index else index


def _isnan(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def _read(c, row):
    if isinstance(c, (LogicalCapture, AlignedView)):
        # rebuilt from its ranks or rows (torch; fp64 where partial sums were added), flat as raw() reads
        return c.tensor(row).reshape(-1)
    return _typed(c.raw(row), row["dtype"])


def _compare_rows(ca: Capture, ra, cb: Capture, rb, dtype, atol, rtol):
    return compare(_read(ca, ra), _read(cb, rb), dtype=dtype, atol=atol, rtol=rtol)


def _typed(arr: np.ndarray, dtype: str):
    """numpy arrays compare() understands: bf16 bits go through a torch view, no copy."""
    if dtype in ("bf16", "fp8_e4m3", "fp8_e5m2"):
        import torch

        from workbench.capture.format import DTYPES
        t = torch.from_numpy(arr)
        return t.view(DTYPES[dtype][0]) if dtype == "bf16" else t.view(DTYPES[dtype][0]).float()
    return arr


# -- the per-key work, in bulk -------------------------------------------------------------------
_INT_FIELDS = ("n_diff", "nan_a", "nan_b", "inf_a", "inf_b", "n_nonfinite_mismatch")
_FLOAT_FIELDS = tuple(f for f in FIELDS if f not in _INT_FIELDS and f != "max_ulp")


def _empty_values(n: int) -> dict[str, np.ndarray]:
    out = {f: np.full(n, np.nan) for f in _FLOAT_FIELDS}
    out.update({f: np.zeros(n, dtype=np.int64) for f in _INT_FIELDS})
    out["max_ulp"] = np.zeros(n, dtype=np.uint64)
    out["ref_norm"] = np.zeros(n)
    out["max_abs_index"] = np.empty(n, dtype=object)
    return out


def _raw_rows(c: Capture, pos: np.ndarray) -> dict[str, np.ndarray]:
    ix = c.index
    return {col: ix[col].to_numpy()[pos] for col in ("shard", "offset", "nbytes", "dtype", "shape")}


def pair_metrics(ca, cb, pos_a, pos_b, *, dtype=None, atol: float = 1e-5, rtol: float = 1e-3,
                 desc: str = "compare") -> dict[str, np.ndarray]:
    """:func:`workbench.compare` of index row ``pos_a[i]`` of ``ca`` against row ``pos_b[i]`` of
    ``cb``, for every ``i``: one array per field (plus ``ref_norm`` and ``max_abs_index``).

    Rows must have the same shape. Between two raw captures, tensors of one float format of at
    most :data:`~workbench.numerics.metrics.BATCH_MAX` elements are compared in bulk (one memory
    mapping per shard, one kernel call per pair of shards, pairs spread over the threads); the
    rest, and rebuilt logical or token-aligned tensors, one by one. Either way each value is the
    one :func:`workbench.compare` gives for that pair."""
    from workbench.numerics.metrics import BATCH_MAX, compare_batch
    from workbench.progress import counter

    pos_a = np.asarray(pos_a, dtype=np.int64)
    pos_b = np.asarray(pos_b, dtype=np.int64)
    n = len(pos_a)
    out = _empty_values(n)
    rest = np.arange(n)
    bar = counter(desc=desc, unit="key", total=n) if n >= 200 else None
    if isinstance(ca, Capture) and isinstance(cb, Capture) and n:
        ra, rb = _raw_rows(ca, pos_a), _raw_rows(cb, pos_b)
        from workbench.numerics.metrics import _BATCH_VIEWS

        item = {k: DTYPES_NP[k].itemsize for k in _BATCH_VIEWS}
        kind = ra["dtype"]
        ok = (kind == rb["dtype"]) & np.isin(kind, list(_BATCH_VIEWS))
        if dtype is not None:
            from workbench.numerics.dtypes import canonical

            ok &= kind == canonical(dtype)
        size = np.array([item.get(k, 1) for k in kind], dtype=np.int64)
        numel = ra["nbytes"].astype(np.int64) // size
        ok &= numel <= BATCH_MAX
        if ok.any():
            sel = np.flatnonzero(ok)
            oa, ob = ra["offset"].astype(np.int64), rb["offset"].astype(np.int64)
            # tensors need not start at a multiple of their size (safetensors packs them without
            # padding): each shard is viewed once per misalignment, unaligned loads are fine
            groups = pd.DataFrame({"sa": ra["shard"][sel], "sb": rb["shard"][sel], "k": kind[sel],
                                   "ma": oa[sel] % size[sel], "mb": ob[sel] % size[sel], "i": sel})
            maps_a: dict = {}
            maps_b: dict = {}  # one mapping per shard for this call (only the bytes read are touched)
            for (sa, sb, k, ma, mb), g in groups.groupby(["sa", "sb", "k", "ma", "mb"], sort=False):
                i = g["i"].to_numpy()
                isz = item[k]
                if sa not in maps_a:
                    maps_a[sa] = _buffer(ca, int(sa), pos_a, ra, sel)
                if sb not in maps_b:
                    maps_b[sb] = _buffer(cb, int(sb), pos_b, rb, sel)
                bufa, bufb = maps_a[sa][ma:], maps_b[sb][mb:]
                res = compare_batch(bufa[: len(bufa) // isz * isz], (oa[i] - ma) // isz,
                                    bufb[: len(bufb) // isz * isz], (ob[i] - mb) // isz,
                                    numel[i], [(int(v),) for v in numel[i]], k, atol=atol, rtol=rtol)
                for f, v in res.items():
                    out[f][i] = v
                if bar is not None:
                    bar.update(len(i))
            rest = np.flatnonzero(~ok)
    if len(rest):
        raw_a, raw_b = isinstance(ca, Capture), isinstance(cb, Capture)
        cols_a = ca.index.to_dict("list") if raw_a else None
        cols_b = cb.index.to_dict("list") if raw_b else None
        for i in rest.tolist():
            ta = _read(ca, _row_of(ca, cols_a, int(pos_a[i])))
            tb = _read(cb, _row_of(cb, cols_b, int(pos_b[i])))
            res = compare(ta, tb, dtype=dtype, atol=atol, rtol=rtol)
            for f in FIELDS:
                out[f][i] = getattr(res, f)
            out["ref_norm"][i] = res.ref_norm
            out["max_abs_index"][i] = res.max_abs_index
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    where = out["max_abs_index"]
    for i in range(n):  # lists, as the table held them (an object array of lists, never a 2-D array)
        if where[i] is not None:
            where[i] = list(where[i])
    return out


def _buffer(c: Capture, shard: int, pos: np.ndarray, rows: dict, sel: np.ndarray) -> np.ndarray:
    """Shard ``shard`` of ``c`` mapped whole, after checking it holds the last byte of the
    selected tensors stored in it (else the truncated-shard error names that tensor's key)."""
    mine = sel[rows["shard"][sel] == shard]
    ends = rows["offset"][mine].astype(np.int64) + rows["nbytes"][mine].astype(np.int64)
    j = int(np.argmax(ends))
    key = c.index.iloc[int(pos[mine[j]])]
    return c.shard_buffer(shard, key=key, end=int(ends[j]))


def _row_of(c, cols, pos: int):
    if cols is None:  # a logical or aligned view reads its rebuild plan from the full row
        return c.index.iloc[pos]
    return {k: v[pos] for k, v in cols.items()}


def _values(ctl, cand, pos_a, pos_b, dtype, atol, rtol, client, partition, desc):
    if client is None:
        return pair_metrics(ctl, cand, pos_a, pos_b, dtype=dtype, atol=atol, rtol=rtol, desc=desc)
    from workbench.analysis.distributed import pair_metrics_on

    return pair_metrics_on(client, ctl, cand, pos_a, pos_b, dtype=dtype, atol=atol, rtol=rtol,
                           partition=partition)


def _judge(m: pd.DataFrame, aa_pos, ctl, cand, rep, rl, dtype, atol, rtol, *, client=None,
           partition=None) -> pd.DataFrame:
    """The comparison table from the merged key table ``m`` (columns c_pos, d_pos)."""
    keys = list(KEY_FIELDS)
    n = len(m)
    if n == 0:
        return pd.DataFrame(columns=[*keys, "seq", "status", *FIELDS, "aa", "metric", "value",
                                     "threshold", "exceeded"])
    c_pos, d_pos = m["c_pos"].to_numpy(dtype=float), m["d_pos"].to_numpy(dtype=float)
    has_c, has_d = ~np.isnan(c_pos), ~np.isnan(d_pos)
    shape_c = m["shape"].to_numpy(dtype=object)
    shape_d = m["shape_candidate"].to_numpy(dtype=object)
    both = has_c & has_d
    same_shape = np.array([bool(b) and list(x) == list(y) for b, x, y in zip(both, shape_c, shape_d)], dtype=bool)
    cmp_i = np.flatnonzero(same_shape)
    vals = _values(ctl, cand, c_pos[cmp_i].astype(np.int64), d_pos[cmp_i].astype(np.int64), dtype, atol, rtol,
                   client, partition, f"compare {ctl.arm} / {cand.arm}")
    # rules: one lookup per (op, name, layer), integer tensors exact under the default rule
    ops, names, layers = m["op"].to_numpy(), m["name"].to_numpy(), m["layer"].to_numpy()
    dtypes = m["dtype"].to_numpy(dtype=object)
    cache: dict = {}
    rules = []
    for o, nm, ly, hc, dt in zip(ops, names, layers, has_c, dtypes):
        r = cache.get((o, nm, ly))
        if r is None:
            r = cache[(o, nm, ly)] = _rule_for(rl, o, nm, int(ly))
        if r is DEFAULT_RULE and hc and dt in INTEGER_DTYPES:
            r = EXACT_RULE  # token ids, indices, positions: any changed value is a divergence
        rules.append(r)
    metric = np.array([r.metric for r in rules], dtype=object)
    full = _empty_values(n)
    for f in FIELDS:
        if f in _FLOAT_FIELDS:
            full[f][cmp_i] = vals[f]
    ref_zero = np.zeros(n, dtype=bool)
    ref_zero[cmp_i] = vals["ref_norm"] == 0
    metric = np.where(ref_zero & np.isin(metric, RELATIVE_METRICS), "max_abs", metric).astype(object)
    status = np.where(has_c & ~has_d, "only_control", np.where(~has_c, "only_candidate", "shape_mismatch")).astype(object)
    dt_c, dt_d = dtypes, m["dtype_candidate"].to_numpy(dtype=object)
    status[cmp_i] = np.where(dt_c[cmp_i] != dt_d[cmp_i], "dtype_mismatch", "ok")
    status[cmp_i[vals["n_nonfinite_mismatch"] > 0]] = "nonfinite"
    # the value each key is judged on, and its A/A noise
    cols = {f: (full[f] if f in _FLOAT_FIELDS else None) for f in FIELDS}
    value = np.full(n, np.nan)
    aa_val = np.full(n, np.nan)
    for mt in set(metric[cmp_i].tolist()):
        j = np.flatnonzero(metric[cmp_i] == mt)
        value[cmp_i[j]] = np.asarray(vals[mt][j], dtype=np.float64)
    if rep is not None and aa_pos is not None:
        ap = aa_pos[cmp_i]
        have = ~np.isnan(ap.astype(float))
        rep_shapes = rep.index["shape"].to_numpy(dtype=object)
        have &= np.array([h and list(rep_shapes[int(a)]) == list(shape_c[i]) for h, a, i in zip(have, ap, cmp_i)],
                         dtype=bool) if len(ap) else have
        hi = np.flatnonzero(have)
        if len(hi):
            av = _values(ctl, rep, c_pos[cmp_i[hi]].astype(np.int64), ap[hi].astype(np.int64), dtype, atol, rtol,
                         client, partition, f"A/A {ctl.arm} / {rep.arm}")
            mts = metric[cmp_i[hi]]
            for mt in set(mts.tolist()):
                j = np.flatnonzero(mts == mt)
                aa_val[cmp_i[hi[j]]] = np.asarray(av[mt][j], dtype=np.float64)
    thr0 = np.array([r.threshold for r in rules], dtype=np.float64)
    fac = np.array([r.aa_factor for r in rules], dtype=np.float64)
    floor = np.array([r.floor for r in rules], dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        threshold = np.where(np.isnan(aa_val), thr0, np.maximum(fac * aa_val, floor))
    threshold = np.where(np.isfinite(threshold), threshold, thr0)  # never let an A/A value switch the check off
    with np.errstate(invalid="ignore"):
        exceeded = np.isin(status, ["shape_mismatch", "nonfinite"]) | (~np.isnan(value) & (value > threshold))
    status = np.where(exceeded & (status == "ok"), "diverged", status).astype(object)
    # columns: as the per-key records were (ints stay ints where every key was compared)
    out = {f: m[f].to_numpy() for f in keys}
    out["seq"] = np.where(has_c, np.nan_to_num(m["seq"].to_numpy(dtype=float), nan=-1), -1).astype(np.int64)
    out["seq_candidate"] = np.where(has_d, np.nan_to_num(m["seq_candidate"].to_numpy(dtype=float), nan=-1),
                                    -1).astype(np.int64)
    out["dtype"] = np.where(has_c, dt_c, None)
    out["dtype_candidate"] = np.where(has_d, dt_d, None)
    out["shape"] = _objects([list(s) if h else None for h, s in zip(has_c, shape_c)])
    out["shape_candidate"] = _objects([list(s) if h else None for h, s in zip(has_d, shape_d)])
    out["metric"] = metric
    out["rule"] = np.array([r.pattern for r in rules], dtype=object)
    every = len(cmp_i) == n
    for f in FIELDS:
        if f in _FLOAT_FIELDS:
            out[f] = cols[f]
        elif every:
            v = vals[f]
            out[f] = v.astype(np.int64) if f != "max_ulp" or (len(v) == 0 or int(v.max()) < 2**63) else v
        else:
            col = np.full(n, np.nan)
            col[cmp_i] = vals[f].astype(np.float64)
            out[f] = col
    mai = np.empty(n, dtype=object)
    mai[cmp_i] = vals["max_abs_index"]
    out["max_abs_index"] = mai
    out.update(aa=aa_val, value=value, threshold=threshold, exceeded=exceeded.astype(bool), status=status)
    table = pd.DataFrame(out)
    table["_order"] = np.where(table["seq"] >= 0, table["seq"], table["seq_candidate"] + 10**12)
    return table.sort_values("_order", kind="stable").drop(columns="_order").reset_index(drop=True)


def _objects(items: list) -> np.ndarray:
    """A 1-D object array of these items (lists stay list elements)."""
    a = np.empty(len(items), dtype=object)
    for i, v in enumerate(items):
        a[i] = v
    return a
