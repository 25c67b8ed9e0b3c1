"""Figures of same-input replay and counterfactuals (``workbench.analysis.replay``)."""

from __future__ import annotations

from workbench.plots._style import COLORS, add_status_strip, log_split, metric_title

__all__ = ["replay_figure", "counterfactuals_figure"]


def replay_figure(ds, *, var: str = "err_oracle", title: str | None = None):
    """Error vs FP64 per case for every variant, with the captured output's error as a line;
    the legend says in how many cases each variant is closer to FP64. A variant that was not run
    on a case (skipped) or whose error is 0 is marked in a strip under the plot, never drawn at a
    made-up value."""
    import plotly.graph_objects as go

    fig = go.Figure()
    x = [f"r{r} s{s} L{l}" for r, s, l in zip(ds["rank"].values, ds.step.values, ds.layer.values)]
    strip = []
    for i, v in enumerate(ds.variant.values):
        y, zero, missing = log_split(ds[var].sel(variant=v).to_numpy())
        n, ran = int(ds.n_closer.sel(variant=v)), int((~missing).sum())
        color = COLORS[i % len(COLORS)]
        if ran:
            fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=f"{v} ({n}/{ran} closer)",
                                     legendgroup=str(v), marker=dict(color=color)))
        strip += [dict(x=[c for c, z in zip(x, zero) if z], row="bit-identical", name=f"{v}: error 0",
                       color=color, legendgroup=str(v)),
                  dict(x=[c for c, m in zip(x, missing) if m], row="skipped", name=f"{v}: skipped (not run)",
                       color=color, legendgroup=str(v))]
    if var == "err_oracle":
        fig.add_trace(go.Scatter(x=x, y=log_split(ds.captured_err_oracle.values)[0], mode="lines",
                                 name="captured output", line=dict(color="black", dash="dot")))
    add_status_strip(fig, strip, rows=("bit-identical", "skipped"))
    fig.update_layout(title=title or f"replay of {ds.attrs.get('op')}/{ds.attrs.get('output')}: {metric_title(var)}",
                      xaxis_title="case (rank, step, layer)", yaxis_title=metric_title(var), yaxis_type="log",
                      yaxis_exponentformat="e", height=460)
    return fig


def counterfactuals_figure(ds, *, title: str | None = None):
    """Bars: mean error vs FP64 of each one-knob change, with its share of the added error."""
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=[str(c) for c in ds.change.values], y=log_split(ds.mean_err_oracle.values)[0],
                           text=[f"{100 * s:.0f}%" for s in ds.share.values], textposition="outside"))
    fig.update_layout(title=title or f"one knob at a time from {ds.attrs.get('base')}", yaxis_type="log",
                      yaxis_exponentformat="e", xaxis_title="policy change (one knob)",
                      yaxis_title="mean relative L2 error against FP64", height=400)
    return fig
