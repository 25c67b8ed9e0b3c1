"""Figure of relocation invariance (``workbench.analysis.relocation``)."""

from __future__ import annotations

__all__ = ["relocation_figure"]


def relocation_figure(ds, *, title: str | None = None):
    """Grid layer x page order: green where every relocation is bitwise identical, red otherwise,
    the largest difference in the hover text."""
    import plotly.graph_objects as go

    inv = ds.invariant.transpose("layer", "page_order")
    mx = ds.worst_max_abs.transpose("layer", "page_order")
    fig = go.Figure(go.Heatmap(z=inv.values.astype(int), x=[str(p) for p in inv.page_order.values],
                               y=[str(l) for l in inv.layer.values], zmin=0, zmax=1,
                               colorscale=[[0, "#cf222e"], [1, "#2da44e"]], showscale=False,
                               customdata=mx.values, hovertemplate="layer %{y}, %{x}: max |diff| %{customdata:.3e}<extra></extra>"))
    fig.update_layout(title=title or "bitwise invariance under KV page relocation", xaxis_title="page order",
                      yaxis_title="layer", height=320)
    return fig
