"""Where do two runs part? Error curves with the A/A noise band, the first divergence in causal
order, a layer x step heatmap, and grafts that prove where a fault starts.

Everything here is built on :func:`~workbench.analysis.compare.compare_captures` (one row per
tensor key, the metrics of :func:`workbench.compare`, per-key A/A noise and thresholds); these
functions only reshape its table into labeled xarray Datasets.

A *graft* replaces tensors of the candidate run by the control's and re-runs the candidate from
there. If the first divergent op still diverges when its inputs come from the control, the fault
starts inside that op; if grafting the op's output makes every later key agree, nothing else
downstream is at fault. The re-run is any callable ``rerun(overrides) -> Capture`` (the protocol
:class:`workbench.capture.recorder.Rerun`): :class:`~workbench.capture.recorder.ModelRerun` runs
any torch model under the recorder with forward hooks that return the grafted tensors; a model
with its own capture code implements the protocol itself (the bundled hybrid decoder's is
``workbench.models.hybrid.HybridRerun``).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
import xarray as xr

from workbench.analysis.compare import ComparisonResult, compare_captures
from workbench.capture.format import KEY_FIELDS
from workbench.capture.reader import Capture, open_capture
from workbench.errors import AnalysisError

__all__ = ["divergence_curves", "first_divergence", "divergence_heatmap", "graft", "key_of"]

_COMPARED = ("ok", "diverged", "dtype_mismatch", "nonfinite")


def _result(control, candidate, aa, rules, filters) -> ComparisonResult:
    if isinstance(control, ComparisonResult):
        if candidate is not None or filters:
            raise AnalysisError("candidate and filters are not used when control is a ComparisonResult",
                                key="candidate", fix="pass compare_captures(...) alone, or two captures")
        return control
    if candidate is None:
        raise AnalysisError("candidate is missing", key="candidate",
                            fix="pass divergence_curves(control, candidate, aa=control_repeat)")
    return compare_captures(control, candidate, aa=aa, rules=rules, **filters)


def _first_attrs(res: ComparisonResult) -> dict[str, Any]:
    fd = res.first_divergence()
    if fd is None:
        return {"first_found": 0}
    return {"first_found": 1, **{f"first_{f}": (int(fd[f]) if f in ("rank", "step", "layer") else str(fd[f]))
                                 for f in KEY_FIELDS},
            "first_seq": int(fd["seq"]), "first_value": float(fd["value"]),
            "first_threshold": float(fd["threshold"]), "first_metric": str(fd["metric"]),
            "first_status": str(fd["status"])}


def _attrs(res: ComparisonResult, **extra) -> dict[str, Any]:
    return {"control": res.control_path, "candidate": res.candidate_path, "aa": res.aa_path or "",
            "control_arm": res.control_arm, "candidate_arm": res.candidate_arm,
            "first_divergence": res.describe_first(), **_first_attrs(res), **extra}


def divergence_curves(control, candidate=None, *, aa=None, rules=None, metric: str = "rel_l2",
                      by: Sequence[str] = ("op", "layer"), name: str | None = "output",
                      reduce: str = "max", **filters) -> xr.Dataset:
    """Error between two captures per layer (and per op, step, rank), with the A/A noise band.

    Parameters
    ----------
    control, candidate: captures or paths, or ``control`` a :class:`ComparisonResult` (then
        ``candidate`` is None)
    aa: an A/A repeat of the control: the per-key noise (``aa``) and thresholds
    rules: threshold rules, as in :func:`compare_captures`
    metric: a metric column (rel_l2, max_abs, mean_abs, max_ulp, median_ulp, frac_outside)
    by: key fields that become dims, any of rank, step, layer, op, name; the rest are reduced
    name: keep only this tensor name (None: all; then add "name" to ``by`` to keep them apart)
    reduce: "max" or "mean" over the reduced key fields
    filters: restrict both captures as :meth:`Capture.select` does

    Returns
    -------
    xarray.Dataset with dims ``by``: ``error`` (the metric), ``aa`` (A/A noise, meaningful where
    the rule's metric is ``metric``), ``threshold``, ``exceeded`` (any key beyond its threshold),
    ``n_keys``; NaN where no key exists. attrs: metric, reduce, the first divergence
    (``first_layer``, ``first_op``, ...; ``first_found`` 0/1) and the capture paths.

    Example
    -------
    >>> ds = divergence_curves("captures/control", "captures/candidate",
    ...                        aa="captures/control-repeat")                  # doctest: +SKIP
    >>> ds.error.sel(op="qsa").to_series()                                   # doctest: +SKIP
    """
    res = _result(control, candidate, aa, rules, filters)
    t = res.table[res.table["status"].isin(_COMPARED)]
    if metric not in t.columns:
        raise AnalysisError(f"unknown metric {metric!r}", key="metric",
                            fix="use one of rel_l2, max_abs, mean_abs, max_ulp, median_ulp, frac_outside")
    by = list(by)
    bad = [b for b in by if b not in KEY_FIELDS]
    if bad or not by:
        raise AnalysisError(f"by must be a non-empty subset of {list(KEY_FIELDS)}, got {by}", key="by",
                            fix="pass by=('op', 'layer') or by=('layer', 'step')")
    if reduce not in ("max", "mean"):
        raise AnalysisError(f"reduce must be 'max' or 'mean', got {reduce!r}", key="reduce", fix="pass reduce='max'")
    if name is not None:
        t = t[t["name"] == name]
    if not len(t):
        raise AnalysisError(f"no compared keys with name={name!r}", key="name",
                            fix=f"use one of {sorted(res.table['name'].unique())} or name=None")
    g = t.assign(error=t[metric].astype(float)).groupby(by, sort=True)
    d = g.agg(error=("error", reduce), aa=("aa", "max"), threshold=("threshold", "max"),
              exceeded=("exceeded", "any"), n_keys=("seq", "size"))
    ds = xr.Dataset.from_dataframe(d)
    ds["exceeded"] = ds.exceeded.fillna(False).astype(bool)
    ds["n_keys"] = ds.n_keys.fillna(0).astype(int)
    ds["error"].attrs.update(long_name=metric, reduce=reduce)
    ds["aa"].attrs["long_name"] = "A/A noise (control vs its repeat) of each key's rule metric"
    ds.attrs.update(_attrs(res, analysis="divergence_curves", metric=metric, reduce=reduce,
                           name=name or "all", by=json.dumps(by),
                           rule_metrics=json.dumps(sorted(t["metric"].unique().tolist()))))
    return ds


def first_divergence(control, candidate=None, *, aa=None, rules=None, context: int | None = None,
                     **filters) -> xr.Dataset:
    """The keys in causal (seq) order with their error, threshold and A/A noise; the first key
    beyond its threshold in attrs.

    Parameters
    ----------
    control, candidate, aa, rules, filters: as in :func:`divergence_curves`
    context: keep only this many keys before and after the first divergence (None: all)

    Returns
    -------
    xarray.Dataset along dim ``key`` (causal order) with coords rank, step, layer, op, name, seq;
    vars ``value`` (the rule metric), ``threshold``, ``aa``, ``exceeded``, ``status``,
    ``rel_l2``, ``max_abs``, ``max_ulp``. attrs ``first_found`` (0/1), ``first_rank``,
    ``first_step``, ``first_layer``, ``first_op``, ``first_name``, ``first_seq``,
    ``first_value``, ``first_threshold`` and ``first_divergence`` (one sentence).

    Example
    -------
    >>> ds = first_divergence("captures/control", "captures/candidate", aa="captures/control-repeat")  # doctest: +SKIP
    >>> ds.attrs["first_layer"], ds.attrs["first_op"], ds.attrs["first_name"]               # doctest: +SKIP
    (3, 'qsa', 'partial_o')
    """
    res = _result(control, candidate, aa, rules, filters)
    ds = res.to_xarray()
    keep = [v for v in ("value", "threshold", "aa", "exceeded", "status", "metric", "rel_l2", "max_abs", "max_ulp")
            if v in ds]
    ds = ds[keep]
    first = res.first_divergence()
    if context is not None and first is not None:
        pos = int(np.flatnonzero(res.table.index == first.name)[0])
        ds = ds.isel(key=slice(max(0, pos - context), pos + context + 1))
    ds.attrs.update(_attrs(res, analysis="first_divergence", order="causal (seq of the control)"))
    return ds


def divergence_heatmap(control, candidate=None, *, aa=None, rules=None, metric: str = "rel_l2",
                       op: str | None = None, name: str | None = "output", rank: int | None = None,
                       reduce: str = "max", **filters) -> xr.Dataset:
    """A metric over (layer, step): :func:`divergence_curves` with ``by=("layer", "step")``.

    ``op``/``rank`` keep one op / rank (None: the maximum over all). Layer -1 (no layer) is dropped.

    Example
    -------
    >>> hm = divergence_heatmap("captures/control", "captures/candidate-bf16-state", op="gdn",
    ...                         name="state")                                  # doctest: +SKIP
    >>> hm.error.dims
    ('layer', 'step')
    """
    if op is not None:
        filters["op"] = op
    if rank is not None:
        filters["rank"] = rank
    ds = divergence_curves(control, candidate, aa=aa, rules=rules, metric=metric, by=("layer", "step"),
                           name=name, reduce=reduce, **filters)
    ds = ds.sel(layer=ds.layer >= 0)
    ds.attrs.update(analysis="divergence_heatmap", op=op or "all", rank="all" if rank is None else rank)
    return ds


# -- grafts ------------------------------------------------------------------------------------

def key_of(row) -> tuple:
    """(rank, step, layer, op, name) of a table row, a dict or a tuple."""
    if isinstance(row, tuple) and len(row) == len(KEY_FIELDS):
        return tuple(row)
    try:
        return tuple((int(row[f]) if f in ("rank", "step", "layer") else str(row[f])) for f in KEY_FIELDS)
    except (KeyError, TypeError, IndexError):
        raise AnalysisError(f"a key needs the fields {list(KEY_FIELDS)}, got {row!r}", key="at",
                            fix="pass dict(rank=0, step=0, layer=3, op='qsa', name='output')") from None


def graft(rerun: Callable[[Mapping[tuple, torch.Tensor]], Capture], control, *, at=None,
          replace: str | Sequence[str] = "input", candidate=None, aa=None, rules=None) -> xr.Dataset:
    """Re-run the candidate with tensors of the control grafted in, and compare with the control.

    Parameters
    ----------
    rerun: ``rerun(overrides) -> Capture``: runs the candidate arm again, replacing each tensor
        whose key ``(rank, step, layer, op, name)`` is in ``overrides`` by the given value at the
        moment it is produced, and returns the capture of that run (``rerun({})``: no graft)
    control: the control capture (the source of the grafted tensors and the reference)
    at: the op to test: a key (dict or row) whose rank, step, layer and op are used; default the
        first divergence of ``compare_captures(control, rerun({}))``
    replace: the tensor names of that op to take from the control, e.g. ``"input"`` (is the op
        itself at fault?) or ``"output"`` (does everything after it agree?)
    candidate: the un-grafted candidate capture (default ``rerun({})``)
    aa, rules: as in :func:`compare_captures`

    Returns
    -------
    xarray.Dataset along dims ``variant`` (["candidate", "grafted"]) and ``key`` (the control's
    keys in causal order, coords rank, step, layer, op, name, seq): ``value`` (rule metric),
    ``threshold``, ``exceeded``. attrs: the graft (``at_*``, ``replaced``), the first divergence
    of each variant, ``op_agrees`` (every tensor of the ``at`` op after the grafted ones is within
    its threshold in the grafted run), ``downstream_agrees`` (every key after the grafted ones is)
    and ``verdict`` (one sentence).

    Example
    -------
    >>> rerun = HybridRerun(model, candidate_arm, prompt, steps=1)               # doctest: +SKIP
    >>> ctl = HybridRerun(model, control_arm, prompt, steps=1)({})              # doctest: +SKIP
    >>> ds = graft(rerun, ctl, replace="input")                                 # doctest: +SKIP
    >>> ds.attrs["verdict"]                                                      # doctest: +SKIP
    'with the control's inputs, layer 3 qsa still diverges: the fault starts in this op'
    """
    ctl = control if isinstance(control, Capture) else open_capture(control)
    base = candidate if candidate is not None else rerun({})
    base = base if isinstance(base, Capture) else open_capture(base)
    before = compare_captures(ctl, base, aa=aa, rules=rules)
    if at is None:
        fd = before.first_divergence()
        if fd is None:
            raise AnalysisError("the candidate does not diverge from the control: nothing to graft", key="at",
                                fix="pass at=dict(rank=, step=, layer=, op=) to graft anyway")
        at = fd
    names = [replace] if isinstance(replace, str) else list(replace)
    try:
        r, s, l, o = int(at["rank"]), int(at["step"]), int(at["layer"]), str(at["op"])
    except (KeyError, TypeError):
        raise AnalysisError(f"at must name rank, step, layer and op, got {at!r}", key="at",
                            fix="pass at=dict(rank=0, step=0, layer=3, op='qsa')") from None
    idx = ctl.index
    overrides: dict[tuple, torch.Tensor] = {}
    for n in names:
        m = (idx["rank"] == r) & (idx["step"] == s) & (idx["layer"] == l) & (idx["op"] == o) & (idx["name"] == n)
        if not m.any():
            have = sorted(idx[(idx["step"] == s) & (idx["layer"] == l) & (idx["op"] == o)]["name"].unique())
            raise AnalysisError(f"the control has no tensor {o}/{n} at rank={r} step={s} layer={l}", key="replace",
                                fix=f"graft one of {have}")
        overrides[(r, s, l, o, n)] = ctl.get(rank=r, step=s, layer=l, op=o, name=n).clone()
    grafted = rerun(overrides)
    grafted = grafted if isinstance(grafted, Capture) else open_capture(grafted)
    after = compare_captures(ctl, grafted, aa=aa, rules=rules)
    ds = _graft_dataset(before, after)
    seq_g = max(int(ctl.index.loc[(idx["rank"] == k[0]) & (idx["step"] == k[1]) & (idx["layer"] == k[2])
                                  & (idx["op"] == k[3]) & (idx["name"] == k[4]), "seq"].iloc[0]) for k in overrides)
    seq = ds.seq.to_numpy()
    later = seq > seq_g
    same_op = later & (ds["rank"].to_numpy() == r) & (ds.step.to_numpy() == s) & (ds.layer.to_numpy() == l) \
        & (ds.op.to_numpy() == o)
    ex = ds.exceeded.sel(variant="grafted").to_numpy()
    op_agrees = bool(same_op.any()) and not bool(ex[same_op].any())
    downstream = not bool(ex[later].any())
    where = f"layer {l} {o} (rank {r}, step {s})"
    what = "+".join(names)
    if op_agrees:
        verdict = f"with the control's {what}, {where} agrees: the fault enters through its {what}, upstream of it"
    elif bool(same_op.any()):
        verdict = f"with the control's {what}, {where} still diverges: the fault starts in this op"
    else:
        verdict = f"{where} has no tensor after {what}"
    if downstream:
        verdict += f"; every key after the graft agrees: nothing after {where}/{what} is at fault"
    fa = after.first_divergence()
    ds.attrs.update(analysis="graft", control=str(ctl.path), candidate=str(base.path),
                    at_rank=r, at_step=s, at_layer=l, at_op=o, replaced=json.dumps(names), graft_seq=seq_g,
                    op_agrees=int(op_agrees), downstream_agrees=int(downstream), verdict=verdict,
                    first_before=before.describe_first(), first_after=after.describe_first(),
                    first_after_key=json.dumps(None if fa is None else list(key_of(fa))))
    return ds


def _graft_dataset(before: ComparisonResult, after: ComparisonResult) -> xr.Dataset:
    keys = list(KEY_FIELDS)
    b = before.table[before.table["seq"] >= 0]
    a = after.table[after.table["seq"] >= 0][keys + ["value", "threshold", "exceeded"]]
    m = b[keys + ["seq", "value", "threshold", "exceeded"]].merge(a, on=keys, how="left", suffixes=("", "_g"))
    m["exceeded_g"] = m["exceeded_g"].fillna(False).astype(bool)
    coords = {f: ("key", m[f].to_numpy()) for f in (*keys, "seq")}
    coords["variant"] = ["candidate", "grafted"]
    return xr.Dataset(
        {"value": (("variant", "key"), np.stack([m["value"].to_numpy(float), m["value_g"].to_numpy(float)])),
         "threshold": (("variant", "key"), np.stack([m["threshold"].to_numpy(float), m["threshold_g"].to_numpy(float)])),
         "exceeded": (("variant", "key"), np.stack([m["exceeded"].to_numpy(bool), m["exceeded_g"].to_numpy(bool)]))},
        coords=coords)
