"""Figures of :mod:`workbench.analysis.splitk` results."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots
import xarray as xr

from workbench.plots._style import log_colorbar, metric_title

__all__ = ["splitk_grid_figure"]


def splitk_grid_figure(ds: xr.Dataset, *, var: str = "fails") -> go.Figure:
    """Heatmap partial dtype x splits, one panel per reduction order, of ``var`` ("fails",
    "fails_control", "partial_cause", "rel_l2", "max_ulp").

    Example
    -------
    >>> splitk_grid_figure(splitk_sweep(x, w)).show()                   # doctest: +SKIP
    """
    orders = [str(o) for o in ds.order.values]
    share = var.startswith(("fail", "partial"))
    fig = make_subplots(rows=len(orders), cols=1, subplot_titles=[f"reduction order: {o}" for o in orders],
                        shared_xaxes=True)
    da = ds[var]
    unit = str(da.attrs.get("units", "")) or metric_title(var)
    zero_seen = False
    for i, o in enumerate(orders):
        z = da.sel(order=o).transpose("partial_dtype", "splits").values.astype(float)
        ys = [str(p) for p in ds.partial_dtype.values]
        if share:
            zc, colorbar = z, dict(title=metric_title(var), tickformat=".0%")
        else:  # errors span decades (ULPs reach 1e9 where a value's sign or exponent flips): log colours
            zc, colorbar = log_colorbar(z, unit=unit + " (log scale)")
        text = np.where(np.isfinite(z), np.char.mod("%.3g", np.nan_to_num(z)), "not run")
        fig.add_trace(go.Heatmap(z=zc, x=ds.splits.values, y=ys, colorscale="Reds", showscale=i == 0,
                                 colorbar=colorbar, zmin=0 if share else None, zmax=1 if share else None,
                                 customdata=text, hovertemplate="splits=%{x} partial=%{y}: %{customdata}"
                                 + ("" if share else f" {unit}") + "<extra></extra>"),
                      row=i + 1, col=1)
        zero = np.isfinite(z) & (z <= 0)
        if not share and zero.any():
            zero_seen = True
            fig.add_trace(go.Heatmap(z=np.where(zero, 1.0, np.nan), x=ds.splits.values, y=ys, showscale=False,
                                     colorscale=[[0, "#c8c8c8"], [1, "#c8c8c8"]], hoverinfo="skip"),
                          row=i + 1, col=1)
    if zero_seen:
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="0 (exact: equal to FP64 rounded)",
                                 marker=dict(symbol="square", size=12, color="#c8c8c8")))
    fig.update_layout(title=f"split-K sweep: {metric_title(var)} ({ds.attrs.get('fails', '')})" if var == "fails"
                      else f"split-K sweep: {metric_title(var)}", showlegend=zero_seen,
                      legend=dict(orientation="h", y=-0.15))
    for i in range(len(orders)):
        fig.update_yaxes(title_text="partial dtype", row=i + 1, col=1)
    fig.update_xaxes(title_text="K splits (number of partial sums)", row=len(orders), col=1)
    return fig
