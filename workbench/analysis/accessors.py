"""``ds.div``: "where do the runs part?" as methods of the Dataset of a comparison (registered on
import of ``workbench.analysis``).

This is the one path for those questions::

    compare_captures(control, candidate, aa=repeat)   # ComparisonResult: one row per key
        .to_xarray()                                 # Dataset along dim "key"
        .div.first() / .curves() / .heatmap() / .around()

The Dataset is :meth:`ComparisonResult.to_xarray`'s: dim ``key`` in causal order, coords rank,
step, layer, op, name, seq, every metric as a variable, and the first divergence in attrs
(``first_found``, ``first_layer``, ...). The figures of :mod:`workbench.plots.divergence` draw
what these methods return and compute nothing themselves.

Example
-------
>>> ds = compare_captures("captures/control", "captures/candidate",
...                       aa="captures/control-repeat").to_xarray()   # doctest: +SKIP
>>> ds.div.first()                       # {'rank': 0, 'step': 0, 'layer': 3, 'op': 'qsa', ...}   # doctest: +SKIP
>>> ds.div.curves(op="qsa").error        # error per (op, layer), reduced over steps and ranks   # doctest: +SKIP
"""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from workbench.capture.format import KEY_FIELDS
from workbench.errors import AnalysisError

__all__ = ["DivergenceAccessor", "COMPARED"]

# statuses of keys whose metrics were computed (both arms hold the key with one shape)
COMPARED = ("ok", "diverged", "dtype_mismatch", "nonfinite")
_METRICS = ("rel_l2", "max_abs", "mean_abs", "max_ulp", "median_ulp", "frac_outside", "value")


@xr.register_dataset_accessor("div")
class DivergenceAccessor:
    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    def _keyed(self) -> xr.Dataset:
        if "key" not in self._ds.dims or "exceeded" not in self._ds:
            raise AnalysisError("ds.div needs a Dataset along dim 'key' with 'exceeded' (a comparison)",
                                key="ds", fix="use compare_captures(...).to_xarray()")
        return self._ds

    # -- the first divergence -----------------------------------------------------------------
    def first(self) -> dict | None:
        """The first key beyond its threshold in causal order, as a dict (None: no divergence)."""
        ds = self._keyed()
        hit = ds.exceeded.to_numpy().nonzero()[0]
        if not len(hit):
            return None
        row = ds.isel(key=int(hit[0]))
        return {f: row[f].item() for f in (*KEY_FIELDS, "seq", "status", "metric", "value", "threshold", "aa")
                if f in row.variables}

    def finding(self) -> str:
        """The first divergence in one sentence: its key, its error and how far past its A/A
        noise (or its fixed threshold) it is; or that nothing diverges."""
        first = self.first()
        n = int(self._keyed().exceeded.sum())
        if first is None:
            return f"no key diverges beyond its threshold ({self._ds.sizes['key']} keys compared)"
        where = (f"rank {first['rank']}, step {first['step']}, layer {first['layer']}, "
                 f"{first['op']}/{first['name']}")
        v, aa, th = float(first["value"]), float(first.get("aa", float("nan"))), float(first["threshold"])
        if first.get("status") in ("shape_mismatch", "nonfinite"):
            how = f"{first['status'].replace('_', ' ')}"
        elif aa == aa and aa > 0:
            how = f"{first['metric']} {v:.2e} = {v / aa:.0f}x its A/A noise ({aa:.1e})"
        elif aa == 0:
            how = f"{first['metric']} {v:.2e} where the A/A repeat is bit-identical"
        else:
            how = f"{first['metric']} {v:.2e} > threshold {th:.1e}"
        return f"first divergence: {where}, {how}; {n} key(s) beyond their threshold"

    def around(self, before: int = 4, after: int = 8) -> xr.Dataset:
        """The keys from ``before`` keys ahead of the first divergence to ``after`` keys past it
        (the first ``before + after + 1`` keys when nothing diverges)."""
        ds = self._keyed()
        hit = ds.exceeded.to_numpy().nonzero()[0]
        at = int(hit[0]) if len(hit) else 0
        lo = max(0, at - before) if len(hit) else 0
        return ds.isel(key=slice(lo, at + after + 1 if len(hit) else before + after + 1))

    # -- reductions -----------------------------------------------------------------------------
    def _select(self, name: str | None, where: dict) -> xr.Dataset:
        ds = self._keyed()
        m = np.isin(ds.status.to_numpy(), COMPARED) if "status" in ds else np.ones(ds.sizes["key"], bool)
        bad = [k for k in where if k not in KEY_FIELDS]
        if bad:
            raise AnalysisError(f"filters must be key fields {list(KEY_FIELDS)}, got {bad}", key=bad[0],
                                fix="filter with rank=, step=, layer=, op= or name=")
        if name is not None:
            where = {**where, "name": name}
        for k, v in where.items():
            vals = ds[k].to_numpy()
            m &= np.isin(vals, list(v)) if isinstance(v, (list, tuple, set)) else (vals == v)
        if not m.any():
            have = {f: sorted(set(ds[f].to_numpy().tolist()))[:12] for f in where}
            raise AnalysisError(f"no compared keys with {where}", key=next(iter(where), "ds"),
                                fix=f"the Dataset holds {have}")
        return ds.isel(key=np.flatnonzero(m))

    def curves(self, *, metric: str = "rel_l2", by=("op", "layer"), name: str | None = "output",
               reduce: str = "max", **where) -> xr.Dataset:
        """A metric per value of the key fields ``by``, reduced over the others.

        Parameters
        ----------
        metric: a metric variable (rel_l2, max_abs, mean_abs, max_ulp, median_ulp, frac_outside,
            or ``value``: each key's rule metric)
        by: key fields that become dims (any of rank, step, layer, op, name); with ``layer`` in
            ``by``, keys without a layer (-1: lm_head, embeddings) are left out
        name: keep only this tensor name (None: all; add "name" to ``by`` to keep them apart); the
            default ``"output"`` keeps every name when no key is named ``output`` (an engine that
            names its tensors otherwise)
        reduce: "max" or "mean" over the other key fields
        where: key-field filters (``op="qsa"``, ``step=[1, 2]``)

        Returns
        -------
        Dataset with dims ``by``: ``error`` (the metric), ``aa`` (the A/A noise of each key's
        rule metric: comparable to ``error`` where attrs ``rule_metrics`` is ``[metric]``),
        ``aa_band_<dim>`` for each dim (the largest ``aa`` over the other dims: the noise band of
        curves along it), ``threshold``, ``exceeded`` (any key beyond its threshold), ``n_keys``;
        NaN where no key exists. attrs: those of the comparison (first divergence, paths) plus metric, reduce, by,
        ``reduced`` (the key fields reduced over), name, where.
        """
        by = [by] if isinstance(by, str) else list(by)
        sub, name = self._subset(metric, by, reduce, name, where)
        return self._reduce(sub, metric=metric, by=by, name=name, reduce=reduce, where=where)

    def _subset(self, metric: str, by: list, reduce: str, name: str | None, where: dict):
        """The keys a reduction by ``by`` reads (arguments checked), and the tensor name kept."""
        if metric not in _METRICS:
            raise AnalysisError(f"unknown metric {metric!r}", key="metric", fix=f"use one of {list(_METRICS)}")
        bad = [b for b in by if b not in KEY_FIELDS]
        if bad or not by or len(set(by)) != len(by):
            raise AnalysisError(f"by must be distinct key fields among {list(KEY_FIELDS)}, got {by}", key="by",
                                fix="pass by=('op', 'layer') or by=('layer', 'step')")
        if reduce not in ("max", "mean"):
            raise AnalysisError(f"reduce must be 'max' or 'mean', got {reduce!r}", key="reduce",
                                fix="pass reduce='max'")
        if name == "output" and "output" not in set(self._keyed().name.to_numpy().tolist()):
            name = None
        sub = self._select(name, where)
        if "layer" in by:
            keep = sub.layer.to_numpy() >= 0
            if not keep.any():
                raise AnalysisError("no compared keys with a layer (all are layer -1)", key="by",
                                    fix="drop 'layer' from by, e.g. by=('op', 'step')")
            sub = sub.isel(key=np.flatnonzero(keep))
        return sub, name

    def _reduce(self, sub: xr.Dataset, *, metric, by, name, reduce, where) -> xr.Dataset:
        df = sub[[metric, "aa", "threshold", "exceeded", "metric"]].to_dataframe()
        g = df.assign(error=df[metric].astype(float)).groupby(by, sort=True)
        d = g.agg(error=("error", reduce), aa=("aa", "max"), threshold=("threshold", "max"),
                  exceeded=("exceeded", "any"), n_keys=("error", "size"))
        out = xr.Dataset.from_dataframe(d)
        out["exceeded"] = out.exceeded.fillna(False).astype(bool)
        out["n_keys"] = out.n_keys.fillna(0).astype(int)
        out["error"].attrs.update(long_name=metric, reduce=reduce)
        out["aa"].attrs["long_name"] = "A/A noise (control vs its repeat) of each key's rule metric"
        for d in by:  # the noise band of a curve along d: the largest A/A noise over the other dims
            out[f"aa_band_{d}"] = out.aa.max([o for o in by if o != d]) if len(by) > 1 else out.aa
        out.attrs.update(self._ds.attrs)
        reduced = [f for f in KEY_FIELDS if f not in by and f not in where and not (f == "name" and name)]
        out.attrs.update(analysis="curves", metric=metric, reduce=reduce, by=json.dumps(by), reduced=json.dumps(reduced),
                         name=name or "all", where=json.dumps({k: v for k, v in where.items()}, default=str),
                         rule_metrics=json.dumps(sorted(set(df["metric"].astype(str)))))
        return out

    def heatmap(self, *, metric: str = "rel_l2", name: str | None = "output", reduce: str = "max",
                common: bool = True, **where) -> xr.Dataset:
        """``metric`` over (layer, step), reduced over ranks (and ops, unless ``op=`` picks one):
        :meth:`curves` with ``by=("layer", "step")``.

        ``common`` (default): each layer's cells reduce over the same keys, the (rank, op, name)
        recorded at every step that records the layer; a step recorded in more detail would
        otherwise stand out for holding more keys, not for its numerics. The keys left out are
        counted in attrs ``n_left_out`` (``n_keys`` says how many each cell holds)."""
        sub, name = self._subset(metric, ["layer", "step"], reduce, name, where)
        n_all = sub.sizes["key"]
        if common:
            sub = sub.isel(key=_common_keys(sub))
        out = self._reduce(sub, metric=metric, by=["layer", "step"], name=name, reduce=reduce, where=where)
        out.attrs.update(analysis="heatmap", op=str(where.get("op", "all")), common=int(common),
                         n_left_out=int(n_all - sub.sizes["key"]))
        return out


def _common_keys(sub: xr.Dataset) -> np.ndarray:
    """Indices of the keys whose (rank, op, name) a layer records at every step that records it."""
    layer, step = sub.layer.to_numpy(), sub.step.to_numpy()
    ident = list(zip(sub["rank"].to_numpy().tolist(), sub.op.to_numpy().tolist(), sub.name.to_numpy().tolist()))
    per: dict[tuple[int, int], set] = {}
    for i, (l, t) in enumerate(zip(layer.tolist(), step.tolist())):
        per.setdefault((l, t), set()).add(ident[i])
    keep_by_layer: dict[int, set] = {}
    for (l, _), ids in per.items():
        keep_by_layer[l] = ids if l not in keep_by_layer else keep_by_layer[l] & ids
    return np.array([i for i in range(len(ident)) if ident[i] in keep_by_layer[int(layer[i])]], dtype=int)
