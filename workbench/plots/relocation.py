"""Figure of relocation invariance (``workbench.analysis.relocation``)."""

from __future__ import annotations

import numpy as np

__all__ = ["relocation_figure", "relocation_growth_figure"]


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


def relocation_growth_figure(ds, *, order: str = "physical"):
    """How a relocation's difference grows through the model: relative L2 of each layer's output
    against the unrelocated run, one line per relocation (log y; bit-identical layers in a strip)."""
    import plotly.graph_objects as go

    from workbench.plots._style import COLORS, add_status_strip, log_split

    d = ds.sel(order=order)
    fig = go.Figure()
    strip = []
    for i, r in enumerate(d.relocation.values):
        color = COLORS[i % len(COLORS)]
        y, zero, _ = log_split(d.growth.sel(relocation=r).values)
        label = f"relocation {int(r)}"
        fig.add_trace(go.Scatter(x=d.layer.values, y=y, mode="lines+markers", name=label, legendgroup=label,
                                 line=dict(color=color)))
        strip.append(dict(x=d.layer.values[zero].tolist(), row="bit-identical", name="identical to the unmoved run",
                          color="#7f7f7f", legendgroup="identical", showlegend=not any(m["x"] for m in strip)))
    add_status_strip(fig, strip, rows=("bit-identical",))
    fig.update_layout(title=f"{order} page order: each layer's output after relocating the KV pages, relative L2 "
                            f"against the unrelocated run (last step, {ds.attrs['tp']} ranks)",
                      xaxis_title="layer", yaxis_title="rel. L2 (‖moved − unmoved‖ / ‖unmoved‖)",
                      yaxis_type="log", yaxis_exponentformat="e", height=440)
    fig.update_xaxes(dtick=1)
    return fig
