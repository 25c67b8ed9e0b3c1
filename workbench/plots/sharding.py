"""Sharding replay: how far each hypothesis is from the captured run (a bitwise one sits at 0)."""

from __future__ import annotations

import plotly.graph_objects as go


def sharding_figure(report, *, title: str | None = None) -> go.Figure:
    """Grouped bars: per hypothesis (unsplit, or split over the ranks with a partial dtype and an
    order), the fraction of each projection's values that differ from the capture. ``report``: a
    :class:`~workbench.analysis.sharding.ShardingReport`."""
    t = report.table.copy()
    t["hypothesis"] = [("unsplit" if r == 1 else f"{r} ranks, {p}, {o}")
                       for r, p, o in zip(t["ranks"], t["partial_dtype"], t["order"])]
    order = list(dict.fromkeys(t.sort_values(["ranks", "partial_dtype", "order"])["hypothesis"]))
    fig = go.Figure()
    for proj, g in t.groupby("projection", sort=False):
        g = g.set_index("hypothesis").reindex(order)
        frac = (g["mismatched"] / g["elements"]).tolist()
        fig.add_bar(name=proj, x=order, y=frac,
                    text=["bitwise" if b is True else "" for b in g["bitwise"].tolist()], textposition="outside",
                    customdata=g[["max_abs", "rel_l2"]].to_numpy(),
                    hovertemplate="%{x}<br>differing values %{y:.1%}<br>max_abs %{customdata[0]:.3g}"
                                  "<br>rel_l2 %{customdata[1]:.3g}<extra>" + proj + "</extra>")
    fig.update_layout(barmode="group", height=380, margin=dict(t=50, b=40),
                      title=title or f"layer {report.layer} step {report.step}: values that differ from the capture "
                                     f"per sharding hypothesis (tp={report.tp})",
                      yaxis=dict(title="fraction of values that differ", range=[0, 1.12], tickformat=".0%"),
                      xaxis=dict(title="replay"), legend=dict(title="projection"))
    return fig
