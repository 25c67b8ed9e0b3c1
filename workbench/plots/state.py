"""Figures of GDN state analyses (``workbench.analysis.state``)."""

from __future__ import annotations

__all__ = ["state_drift_figure", "state_heads_figure"]


def state_drift_figure(ds, *, var: str | None = None, title: str | None = None):
    """Error against step, one curve per layer (``state_drift``: max over heads) or per head
    (``state_evolution``), log y."""
    import plotly.graph_objects as go

    var = var or ("rel_err_max" if "rel_err_max" in ds else "err_oracle")
    da = ds[var]
    other = [d for d in da.dims if d != "step"]
    fig = go.Figure()
    if not other:
        fig.add_trace(go.Scatter(x=da.step.values, y=da.values, mode="lines", name=var))
    else:
        for v in da[other[0]].values:
            fig.add_trace(go.Scatter(x=da.step.values, y=da.sel({other[0]: v}).values, mode="lines",
                                     name=f"{other[0]} {v}"))
    g = ds.attrs.get("growth")
    fig.update_layout(title=title or f"{var} over steps" + (f" (growth x{g:.2f})" if g is not None else ""),
                      xaxis_title="step", yaxis_title=var, yaxis_type="log", height=400)
    return fig


def state_heads_figure(ds, *, var: str = "state_err", title: str | None = None):
    """Per-head bars of a variant x head result (``chunked_continuation``) or a head vector."""
    import plotly.graph_objects as go

    da = ds[var]
    fig = go.Figure()
    if "variant" in da.dims:
        for v in da.variant.values:
            fig.add_trace(go.Bar(x=da["head"].values, y=da.sel(variant=v).values, name=str(v)))
    else:
        fig.add_trace(go.Bar(x=da["head"].values, y=da.values, name=var))
    fig.update_layout(title=title or f"{var} per head", xaxis_title="head", yaxis_title=var, yaxis_type="log",
                      barmode="group", height=360)
    return fig
