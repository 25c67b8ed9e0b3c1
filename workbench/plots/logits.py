"""Figures of :mod:`workbench.analysis.logits` results."""

from __future__ import annotations

import plotly.graph_objects as go
import xarray as xr

__all__ = ["logit_rounding_figure", "greedy_parity_figure"]


def logit_rounding_figure(ds: xr.Dataset, *, row: int = 0) -> go.Figure:
    """The leading tokens of one row: FP64 value and each rounded value, tied tokens outlined,
    the chosen token starred.

    Example
    -------
    >>> logit_rounding_figure(logit_rounding(logits), row=0).show()     # doctest: +SKIP
    """
    r = ds.isel(row=row)
    labels = [str(int(t)) for t in r.token.values]
    fig = go.Figure()
    for d in r.dtype.values:
        fig.add_trace(go.Scatter(x=labels, y=r.value.sel(dtype=d).values, mode="markers", name=str(d),
                                 marker=dict(size=11 if d == ds.attrs["materialized_dtype"] else 7)))
    tied = [lab for lab, t in zip(labels, r.tied.values) if t]
    fig.add_trace(go.Scatter(x=tied, y=r.value.sel(dtype=ds.attrs["materialized_dtype"]).values[r.tied.values],
                             mode="markers", name=f"tied in {ds.attrs['materialized_dtype']}",
                             marker=dict(size=18, symbol="circle-open", line=dict(width=2))))
    chosen = str(int(r.chosen))
    if chosen in labels:
        # on a category axis a numeric-looking label would be read as a position: give the index
        fig.add_annotation(x=labels.index(chosen),
                           y=float(r.value.sel(dtype=ds.attrs["materialized_dtype"]).values.max()),
                           text=f"chosen {chosen}", showarrow=True, arrowhead=2)
    fig.update_layout(
        title=(f"row {row}: chosen {chosen} (FP64 {int(r.chosen_fp64)}), {int(r.n_tied)} tied, margin "
               f"{int(r.margin_ulp)} ULP, regret {float(r.regret):.4g} nats "
               f"({'pass' if bool(r.regret_pass) else 'FAIL'} <= {ds.attrs['regret_limit']})"),
        xaxis=dict(title="token (by FP64 rank)", type="category"), yaxis_title="logit")
    return fig


def greedy_parity_figure(ds: xr.Dataset) -> go.Figure:
    """Top-2 margin (ULPs) per step for both arms; steps whose tokens differ and ties marked."""
    fig = go.Figure()
    steps = ds.step.values
    for arm in ds.arm.values:
        m = ds.margin_ulp.sel(arm=arm).values
        fig.add_trace(go.Scatter(x=steps, y=m, mode="lines+markers", name=f"{arm} margin"))
        tie = ds.tie.sel(arm=arm).values
        fig.add_trace(go.Scatter(x=steps[tie], y=m[tie], mode="markers", name=f"{arm} tie",
                                 marker=dict(symbol="x", size=12)))
    bad = ~ds.same.values
    fig.add_trace(go.Scatter(x=steps[bad], y=[0] * int(bad.sum()), mode="markers", name="tokens differ",
                             marker=dict(symbol="triangle-up", size=14, color="red")))
    fig.update_layout(title=f"greedy parity: {ds.attrs['n_same']}/{ds.attrs['n_steps']} steps agree "
                            f"(first mismatch: {ds.attrs['first_mismatch']})",
                      xaxis_title="step", yaxis_title=f"top-2 margin ({ds.attrs['materialized_dtype']} ULP)")
    return fig
