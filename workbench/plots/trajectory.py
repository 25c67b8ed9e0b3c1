"""Figures of :mod:`workbench.analysis.trajectory` results."""

from __future__ import annotations

import numpy as np

from workbench.plots._style import COLORS, add_status_strip, log_split

__all__ = ["trajectory_figure"]

_LABEL = {"A/A": "control repeat − control (A/A)", "A/B": "candidate − control"}


def trajectory_figure(ds, *, trajectory: int | None = None):
    """|NLL delta| of the A/A repeat and of the candidate, log y, bit-identical tokens in a strip:
    per token of one ``trajectory``, or (None) per trajectory, the mean over its tokens with its
    first token beside it."""
    import plotly.graph_objects as go

    fig = go.Figure()
    strip = []
    for i, comp in enumerate(ds.comparison.values):
        color, label = COLORS[i], _LABEL.get(str(comp), str(comp))
        d = np.abs(ds.delta.sel(comparison=comp).values)
        if trajectory is None:
            x = ds.trajectory.values
            series = [("mean over tokens", np.nanmean(d, axis=1), "lines+markers", "circle"),
                      ("first token", d[:, 0], "markers", "diamond-open")]
        else:
            row = d[int(trajectory)]
            keep = ~np.isnan(row)
            x = ds.position.values[keep]
            series = [("per token", row[keep], "lines+markers", "circle")]
        for what, v, mode, sym in series:
            y, zero, _ = log_split(v)
            fig.add_trace(go.Scatter(x=x, y=y, mode=mode, name=f"{label}: {what}", legendgroup=label,
                                     line=dict(color=color), marker=dict(symbol=sym, color=color, size=8)))
            strip.append(dict(x=np.asarray(x)[zero].tolist(), row="bit-identical", name=f"{label}: {what} delta 0",
                              color=color, legendgroup=label))
    add_status_strip(fig, strip, rows=("bit-identical",))
    m = ds.mean_abs_delta.values
    verdict = "within the A/A noise" if bool(ds.within_noise) else "beyond the A/A noise"
    where = f"trajectory {int(trajectory)}" if trajectory is not None else f"{ds.sizes['trajectory']} trajectories"
    fig.update_layout(title=f"|NLL delta| on fixed text, {where}: candidate {verdict} (mean |delta| {m[1]:.3g} vs A/A "
                            f"{m[0]:.3g} nats)",
                      xaxis_title="token position in the trajectory" if trajectory is not None else "trajectory",
                      yaxis_title="|NLL delta| (nats, same token)", yaxis_type="log", yaxis_exponentformat="e",
                      height=440)
    if trajectory is None:
        fig.update_xaxes(dtick=1)
    return fig
