"""Figures of GDN state analyses (``workbench.analysis.state``)."""

from __future__ import annotations

from workbench.plots._style import COLORS, add_status_strip, log_split, metric_title

__all__ = ["state_drift_figure", "state_heads_figure"]


def state_drift_figure(ds, *, var: str | None = None, title: str | None = None):
    """Error against step, one curve per layer (``state_drift``: max over heads) or per head
    (``state_evolution``), log y."""
    import plotly.graph_objects as go

    var = var or ("rel_err_max" if "rel_err_max" in ds else "err_oracle")
    da = ds[var]
    other = [d for d in da.dims if d != "step"]
    fig = go.Figure()
    series = [(var, da)] if not other else [(f"{other[0]} {v}", da.sel({other[0]: v})) for v in da[other[0]].values]
    strip = []
    for i, (label, d) in enumerate(series):
        y, zero, _ = log_split(d.values)
        color = COLORS[i % len(COLORS)]
        fig.add_trace(go.Scatter(x=d.step.values, y=y, mode="lines", name=label, legendgroup=label,
                                 line=dict(color=color)))
        strip.append(dict(x=d.step.values[zero].tolist(), row="bit-identical", name=f"{label}: error 0",
                          color=color, legendgroup=label))
    add_status_strip(fig, strip, rows=("bit-identical",))
    g = ds.attrs.get("growth")
    fig.update_layout(title=title or f"{metric_title(var)} over steps" + (f" (growth x{g:.2f})" if g is not None else ""),
                      xaxis_title="step", yaxis_title=metric_title(var), yaxis_type="log", yaxis_exponentformat="e",
                      height=420)
    return fig


def state_heads_figure(ds, *, var: str = "state_err", title: str | None = None):
    """Per-head bars of a variant x head result (``chunked_continuation``) or a head vector."""
    import plotly.graph_objects as go

    da = ds[var]
    fig = go.Figure()
    if "variant" in da.dims:
        for v in da.variant.values:
            fig.add_trace(go.Bar(x=da["head"].values, y=log_split(da.sel(variant=v).values)[0], name=str(v)))
    else:
        fig.add_trace(go.Bar(x=da["head"].values, y=log_split(da.values)[0], name=metric_title(var)))
    zero = (da.values <= 0).any(axis=0) if da.ndim > 1 else da.values <= 0
    if zero.any():  # a bar of height 0 has no place on a log axis: say which heads it hides
        fig.add_annotation(text="no bar: error 0 (bit-identical) at head(s) "
                                + ", ".join(str(h) for h in da["head"].values[zero]),
                           xref="paper", yref="paper", x=0, y=1.08, showarrow=False, align="left")
    fig.update_layout(title=title or f"{metric_title(var)} per head", xaxis_title="head (value head index)",
                      yaxis_title=metric_title(var), yaxis_type="log", yaxis_exponentformat="e",
                      barmode="group", height=380)
    return fig
