"""Figures of :mod:`workbench.analysis.logits` results."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import xarray as xr
from plotly.subplots import make_subplots

from workbench.plots._style import COLORS, add_status_strip, log_split

__all__ = ["logit_rounding_figure", "greedy_parity_figure"]


def logit_rounding_figure(ds: xr.Dataset, *, row: int = 0) -> go.Figure:
    """The leading tokens of one row in two panels: all of them (FP64 value and each rounded
    value, tied tokens outlined), and the same tokens zoomed to the top of the materialized
    dtype's grid, whose representable values are drawn as dotted lines: a tie is two tokens on one
    line, a flip a token that crossed one. The chosen token is marked in both.

    Example
    -------
    >>> logit_rounding_figure(logit_rounding(logits), row=0).show()     # doctest: +SKIP
    """
    from workbench.numerics.dtypes import ulp_of

    r = ds.isel(row=row)
    mat = ds.attrs["materialized_dtype"]
    labels = [str(int(t)) for t in r.token.values]
    vmat = r.value.sel(dtype=mat).values.astype(float)
    top = float(np.nanmax(vmat))
    ulp = float(ulp_of(np.array([top]), mat)[0])
    near = np.flatnonzero(vmat >= top - 2.5 * ulp)[:12]  # the tokens within 2 grid steps of the top
    fig = make_subplots(rows=1, cols=2, column_widths=[0.45, 0.55], horizontal_spacing=0.09,
                        subplot_titles=["leading tokens", f"zoom: the top {len(near)} on the {mat} grid "
                                                          f"(1 ULP = {ulp:.4g})"])
    for i, d in enumerate(r.dtype.values):
        v = r.value.sel(dtype=d).values.astype(float)
        style = dict(size=11 if d == mat else 7, color=COLORS[i % len(COLORS)])
        fig.add_trace(go.Scatter(x=labels, y=v, mode="markers", name=f"logit in {d}", legendgroup=str(d),
                                 marker=style), row=1, col=1)
        fig.add_trace(go.Scatter(x=[labels[j] for j in near], y=v[near], mode="markers", showlegend=False,
                                 legendgroup=str(d), marker=style, hovertemplate="token %{x}: %{y:.8g}"
                                 f"<extra>{d}</extra>"), row=1, col=2)
    tied = r.tied.values.astype(bool)
    for col, idx in ((1, np.flatnonzero(tied)), (2, [j for j in near if tied[j]])):
        fig.add_trace(go.Scatter(x=[labels[j] for j in idx], y=vmat[list(idx)], mode="markers",
                                 name=f"tied in {mat}", legendgroup="tied", showlegend=col == 1,
                                 marker=dict(size=18, symbol="circle-open", line=dict(width=2), color="#cf222e")),
                      row=1, col=col)
    lo, hi = float(np.nanmin(vmat[near])) - 1.5 * ulp, top + 1.5 * ulp  # at most 5 grid steps by `near`
    for g in np.arange(np.floor(lo / ulp), np.ceil(hi / ulp) + 1) * ulp:
        fig.add_hline(y=float(g), line=dict(color="#999", width=1, dash="dot"), row=1, col=2)
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"representable {mat} values",
                             line=dict(color="#999", width=1, dash="dot")))
    fig.update_yaxes(range=[lo, hi], row=1, col=2, tickformat=".6g")
    chosen = str(int(r.chosen))
    for col in (1, 2):
        shown = labels if col == 1 else [labels[j] for j in near]
        if chosen in shown:  # on a category axis a numeric-looking label would be read as a position
            fig.add_annotation(x=shown.index(chosen), y=top, text=f"chosen {chosen}", showarrow=True, arrowhead=2,
                               row=1, col=col)
    fig.update_xaxes(title_text="token id (ordered by FP64 value)", type="category")
    fig.update_yaxes(title_text="logit", row=1, col=1)
    fig.update_layout(
        title=(f"row {row}: chosen {chosen} (FP64 {int(r.chosen_fp64)}), {int(r.n_tied)} tied, margin "
               f"{int(r.margin_ulp)} ULP, regret {float(r.regret):.4g} nats "
               f"({'pass' if bool(r.regret_pass) else 'FAIL'} <= {ds.attrs['regret_limit']})"),
        height=460, legend=dict(orientation="h", y=-0.25))
    return fig


def greedy_parity_figure(ds: xr.Dataset) -> go.Figure:
    """Top-2 margin (ULPs, log scale) per step for both arms up to where their tokens first differ:
    after that fork each arm decodes from its own prefix and their margins no longer compare, so
    the chart stops there and says so. Ties (margin 0) sit in a strip under the plot."""
    fig = go.Figure()
    steps = np.asarray(ds.step.values)
    fork = int(ds.attrs.get("first_mismatch", -1))
    upto = steps <= fork if fork >= 0 else np.ones(len(steps), bool)
    unit = f"{ds.attrs['materialized_dtype']} ULP"
    strip = []
    for i, arm in enumerate(ds.arm.values):
        m = ds.margin_ulp.sel(arm=arm).values.astype(float)[upto]
        y, zero, _ = log_split(m)
        color = COLORS[i % len(COLORS)]
        fig.add_trace(go.Scatter(x=steps[upto], y=y, mode="lines+markers", name=f"{arm}: top-2 margin",
                                 legendgroup=str(arm), line=dict(color=color), connectgaps=False))
        strip.append(dict(x=steps[upto][zero].tolist(), row="tie (margin 0)", name=f"{arm}: tie",
                          color=color, legendgroup=str(arm)))
    add_status_strip(fig, strip, rows=("tie (margin 0)",))
    if fork >= 0:
        fig.add_vline(x=fork, line_dash="dash", line_color="#cf222e",
                      annotation_text=f"tokens differ at step {fork}: the runs fork; later steps not drawn "
                                      f"({int((~upto).sum())} step(s))", annotation_position="top left")
    fig.update_layout(title=f"greedy parity: {ds.attrs['n_same']}/{ds.attrs['n_steps']} steps agree "
                            f"(first mismatch: {fork if fork >= 0 else 'none'})",
                      xaxis_title="decode step", xaxis_dtick=1, yaxis_title=f"top-2 margin ({unit})", yaxis_type="log",
                      yaxis_exponentformat="e", height=440, legend=dict(orientation="h", y=-0.25))
    return fig
