"""Figures of :mod:`workbench.analysis.splitk` results."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots
import xarray as xr

__all__ = ["splitk_grid_figure"]


def splitk_grid_figure(ds: xr.Dataset, *, var: str = "fails") -> go.Figure:
    """Heatmap partial dtype x splits, one panel per reduction order, of ``var`` ("fails",
    "fails_control", "partial_cause", "rel_l2", "max_ulp").

    Example
    -------
    >>> splitk_grid_figure(splitk_sweep(x, w)).show()                   # doctest: +SKIP
    """
    orders = [str(o) for o in ds.order.values]
    fig = make_subplots(rows=len(orders), cols=1, subplot_titles=[f"order={o}" for o in orders], shared_xaxes=True)
    da = ds[var]
    for i, o in enumerate(orders):
        z = da.sel(order=o).transpose("partial_dtype", "splits").values.astype(float)
        fig.add_trace(go.Heatmap(z=z, x=ds.splits.values, y=[str(p) for p in ds.partial_dtype.values],
                                 colorscale="Reds", showscale=i == 0, zmin=0 if var.startswith(("fail", "partial")) else None,
                                 zmax=1 if var.startswith(("fail", "partial")) else None,
                                 hovertemplate="splits=%{x} partial=%{y} " + var + "=%{z}<extra></extra>"),
                      row=i + 1, col=1)
    fig.update_layout(title=f"split-K sweep: {var} ({ds.attrs.get('fails', '')})" if var == "fails"
                      else f"split-K sweep: {var}")
    fig.update_xaxes(title_text="splits", row=len(orders), col=1)
    return fig
