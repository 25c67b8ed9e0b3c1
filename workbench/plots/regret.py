"""Figures of :mod:`workbench.analysis.regret` results."""

from __future__ import annotations

import numpy as np

__all__ = ["regret_figure"]


def regret_figure(ds):
    """Regret per (sequence, position) as a heatmap, each cell labelled with its value; cells over
    the limit marked, cells left out (no token or no golden logits) blank."""
    import plotly.graph_objects as go

    r = ds.regret.values
    lim = ds.attrs["limit"]
    text = [[("" if np.isnan(v) else (f"{v:.3g}" + (" ✗" if v > lim else ""))) for v in row] for row in r]
    fig = go.Figure(go.Heatmap(
        z=r, x=[str(p) for p in ds.pos.values], y=[f"seq {s}" for s in ds.seq.values], text=text,
        texttemplate="%{text}", colorscale="Reds", zmin=0.0, zmax=max(lim * 1.5, float(np.nanmax(r)) if np.isfinite(r).any() else lim),
        colorbar=dict(title="regret (nats)"),
        hovertemplate="%{y}, pos %{x}: regret %{z:.6g} nats<extra></extra>"))
    fig.update_layout(title=f"regret against the golden model: {int(ds.n_fail)} of {int(ds.n_scored)} positions over "
                            f"{lim:g} nats (✗)", xaxis_title="decode position", yaxis_title="sequence (batch row)",
                      yaxis_autorange="reversed", height=120 + 40 * ds.sizes["seq"])
    return fig
