"""Figures of :mod:`workbench.analysis.sampling` results."""

from __future__ import annotations

import plotly.graph_objects as go
import xarray as xr

__all__ = ["sampling_flips_figure"]


def sampling_flips_figure(ds: xr.Dataset) -> go.Figure:
    """The u axis [0, 1) with each flip interval as a bar labelled control -> candidate token.

    Example
    -------
    >>> sampling_flips_figure(sampling_flips(p_a, p_b)).show()           # doctest: +SKIP
    """
    fig = go.Figure()
    fig.add_trace(go.Bar(
        x=ds.width.values, base=ds.lo.values, y=["flips"] * ds.sizes["interval"], orientation="h",
        text=[f"{int(a)}->{int(b)}" for a, b in zip(ds.token_control.values, ds.token_candidate.values)],
        hovertemplate="u in [%{base:.6f}, %{x:.6f} wide)<br>%{text}<extra></extra>", name="flip intervals"))
    if "u" in ds:
        fig.add_trace(go.Scatter(x=ds.u.values, y=["draws"] * ds.sizes["draw"], mode="markers",
                                 marker=dict(color=["red" if f else "gray" for f in ds.flipped_at_u.values], size=10),
                                 name="given u (red: flips)"))
    fig.update_layout(title=f"draws u that flip the sampled token: total width {ds.attrs['total_width']:.6f} "
                            f"in {ds.attrs['n_intervals']} interval(s), order={ds.attrs['order']}",
                      xaxis=dict(title="u: the sampler's uniform draw in [0, 1) (inverse-CDF sampling)", range=[0, 1]), barmode="overlay")
    return fig
