"""Figures of same-input replay and counterfactuals (``workbench.analysis.replay``)."""

from __future__ import annotations

import numpy as np

__all__ = ["replay_figure", "counterfactuals_figure"]


def replay_figure(ds, *, var: str = "err_oracle", title: str | None = None):
    """Error vs FP64 per case for every variant, with the captured output's error as a line;
    the legend says in how many cases each variant is closer to FP64."""
    import plotly.graph_objects as go

    fig = go.Figure()
    x = [f"r{r} s{s} L{l}" for r, s, l in zip(ds["rank"].values, ds.step.values, ds.layer.values)]
    for v in ds.variant.values:
        y = ds[var].sel(variant=v).to_numpy().astype(float)
        n = int(ds.n_closer.sel(variant=v))
        fig.add_trace(go.Scatter(x=x, y=np.where(y > 0, y, 1e-16), mode="markers",
                                 name=f"{v} ({n}/{ds.sizes['case']} closer)"))
    if var == "err_oracle":
        fig.add_trace(go.Scatter(x=x, y=ds.captured_err_oracle.values, mode="lines", name="captured output",
                                 line=dict(color="black", dash="dot")))
    fig.update_layout(title=title or f"replay of {ds.attrs.get('op')}/{ds.attrs.get('output')}: {var}",
                      xaxis_title="case", yaxis_title=var, yaxis_type="log", height=420)
    return fig


def counterfactuals_figure(ds, *, title: str | None = None):
    """Bars: mean error vs FP64 of each one-knob change, with its share of the added error."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=[str(c) for c in ds.change.values], y=ds.mean_err_oracle.values,
                           text=[f"{100 * s:.0f}%" for s in ds.share.values], textposition="outside"))
    fig.update_layout(title=title or f"one knob at a time from {ds.attrs.get('base')}", yaxis_type="log",
                      xaxis_title="change", yaxis_title="mean rel. L2 vs FP64", height=400)
    return fig
