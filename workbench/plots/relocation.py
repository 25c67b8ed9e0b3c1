"""Figure of relocation invariance (``workbench.analysis.relocation``)."""

from __future__ import annotations

import numpy as np

__all__ = ["relocation_figure"]


def relocation_figure(ds, *, title: str | None = None):
    """Grid layer x page order: green where every relocation is bitwise identical, red otherwise,
    each cell saying which, with the largest difference written in it; both colours legended."""
    import plotly.graph_objects as go

    inv = ds.invariant.transpose("layer", "page_order")
    mx = ds.worst_max_abs.transpose("layer", "page_order").values.astype(float)
    ok = inv.values.astype(bool)
    text = np.where(ok, "identical", np.char.add("max |Δ| ", np.char.mod("%.1e", np.nan_to_num(mx))))
    fig = go.Figure(go.Heatmap(z=ok.astype(int), x=[str(p) for p in inv.page_order.values],
                               y=[str(l) for l in inv.layer.values], zmin=0, zmax=1,
                               colorscale=[[0, "#cf222e"], [1, "#2da44e"]], showscale=False,
                               text=text, texttemplate="%{text}", customdata=mx,
                               hovertemplate="layer %{y}, %{x}: max |diff| %{customdata:.3e}<extra></extra>"))
    for name, color in (("bitwise identical under every relocation", "#2da44e"),
                        ("differs under some relocation (largest |difference| in the cell)", "#cf222e")):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name,
                                 marker=dict(symbol="square", size=12, color=color)))
    fig.update_layout(title=title or "bitwise invariance under KV page relocation",
                      xaxis_title="page order of the relocated KV cache", yaxis_title="layer", height=360,
                      showlegend=True, legend=dict(orientation="h", y=-0.3))
    return fig
