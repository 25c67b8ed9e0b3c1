"""``ds.div``: the divergence questions as methods of an xarray Dataset (registered on import of
``workbench.analysis``).

Works on the Dataset of :func:`~workbench.analysis.divergence.first_divergence` or
:meth:`ComparisonResult.to_xarray` (dim ``key`` with coords rank, step, layer, op, name, seq).

Example
-------
>>> ds = first_divergence("captures/control", "captures/candidate", aa="captures/control-repeat")  # doctest: +SKIP
>>> ds.div.first()                       # {'rank': 0, 'step': 0, 'layer': 3, 'op': 'qsa', ...}   # doctest: +SKIP
>>> ds.div.curve(op="qsa", name="output")   # error per layer                                    # doctest: +SKIP
"""

from __future__ import annotations

import xarray as xr

from workbench.errors import AnalysisError

__all__ = ["DivergenceAccessor"]


@xr.register_dataset_accessor("div")
class DivergenceAccessor:
    def __init__(self, ds: xr.Dataset) -> None:
        self._ds = ds

    def _keyed(self) -> xr.Dataset:
        if "key" not in self._ds.dims or "exceeded" not in self._ds:
            raise AnalysisError("ds.div needs a Dataset along dim 'key' with 'exceeded' (a comparison)",
                                key="ds", fix="use first_divergence(...) or compare_captures(...).to_xarray()")
        return self._ds

    def first(self) -> dict | None:
        """The first key beyond its threshold in causal order, as a dict (None: no divergence)."""
        ds = self._keyed()
        hit = ds.exceeded.to_numpy().nonzero()[0]
        if not len(hit):
            return None
        row = ds.isel(key=int(hit[0]))
        return {f: row[f].item() for f in ("rank", "step", "layer", "op", "name", "seq", "value", "threshold")
                if f in row.variables}

    def curve(self, *, op: str | None = None, name: str | None = "output", var: str = "value",
              dim: str = "layer", reduce: str = "max") -> xr.DataArray:
        """``var`` (default the rule metric) along ``dim``, reduced (max/mean) over the other keys."""
        ds = self._keyed()
        m = (ds[dim] >= 0) if dim == "layer" else (ds[dim] == ds[dim])
        if op is not None:
            m = m & (ds.op == op)
        if name is not None:
            m = m & (ds.name == name)
        sub = ds[var].where(m, drop=True)
        if not sub.size:
            raise AnalysisError(f"no keys with op={op!r} name={name!r}", key="op",
                                fix=f"use op among {sorted(set(ds.op.values.tolist()))}")
        g = sub.groupby(sub[dim])
        return g.max() if reduce == "max" else g.mean()

    def heatmap(self, *, op: str | None = None, name: str | None = "output", var: str = "value") -> xr.DataArray:
        """``var`` over (layer, step), maximum over ranks."""
        ds = self._keyed()
        m = ds.layer >= 0
        if op is not None:
            m = m & (ds.op == op)
        if name is not None:
            m = m & (ds.name == name)
        sub = ds[[var]].where(m, drop=True).to_dataframe()
        return sub.groupby(["layer", "step"])[var].max().to_xarray()
