"""Figures of :mod:`workbench.analysis.stats` results."""

from __future__ import annotations

import plotly.graph_objects as go
import xarray as xr

__all__ = ["interval_figure"]


ESTIMATES = {"rate_diff": "candidate − control success rate (paired; 0 = no difference)",
             "ratio": "candidate / control time (paired; 1 = no difference)"}


def interval_figure(ds: xr.Dataset) -> go.Figure:
    """Estimate and confidence interval of a paired_binary, paired_timing, paired_intervals (one row
    per method) or aa_comparison result, with the null (0 or 1) as a line; for aa_comparison the A/A
    band is shaded.

    Example
    -------
    >>> interval_figure(aa_comparison(paired_timing(a, a2), paired_timing(a, b))).show()  # doctest: +SKIP
    """
    est = ds.attrs["estimate"]
    if "comparison" in ds.dims:
        names = [str(c) for c in ds.comparison.values]
        vals, lo, hi = ds.estimate.values, ds.ci_low.values, ds.ci_high.values
    elif "interval" in ds.dims:
        names = [str(c) for c in ds.interval.values]
        vals, lo, hi = [float(ds[est])] * len(names), ds.ci_low.values, ds.ci_high.values
    else:
        names = [ds.attrs["analysis"]]
        vals, lo, hi = [float(ds[est])], [float(ds.ci_low)], [float(ds.ci_high)]
    fig = go.Figure(go.Scatter(
        x=list(vals), y=names, mode="markers", marker=dict(size=12),
        error_x=dict(type="data", symmetric=False, array=[h - v for h, v in zip(hi, vals)],
                     arrayminus=[v - l for v, l in zip(vals, lo)]), name=est))
    fig.add_vline(x=float(ds.attrs["null"]), line_dash="dash", annotation_text="no difference")
    if "noise_low" in ds:
        fig.add_vrect(x0=float(ds.noise_low), x1=float(ds.noise_high), fillcolor="rgba(120,120,120,0.35)",
                      line_width=0, layer="below", annotation_text="A/A noise band",
                      annotation_position="top right")
        verdict = "beats the A/A noise" if bool(ds.beats_noise) else "does not beat the A/A noise"
    elif "contains_zero" in ds:
        k = int(ds.contains_zero.sum())
        verdict = f"{k} of {ds.sizes['interval']} intervals contain no difference"
    elif "p_value" in ds:
        verdict = f"McNemar exact p = {float(ds.p_value):.4g}"
    else:
        verdict = "significant" if bool(ds.significant) else "not significant"
    fig.update_layout(title=f"{est}: {verdict} ({int(100 * ds.attrs['confidence'])}% CI, {ds.attrs['ci_method']})",
                      xaxis_title=ESTIMATES.get(est, est))
    return fig
