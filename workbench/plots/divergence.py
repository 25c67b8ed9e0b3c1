"""Figures of "where do the runs part": they draw the Datasets of ``ds.div`` (the accessor of
:meth:`ComparisonResult.to_xarray`, :mod:`workbench.analysis.accessors`) and compute nothing.

* :func:`divergence_curves_figure`: ``ds.div.curves(...)``: one curve per op (or other leading
  dim) along layer or step, log y, the A/A noise as a band, crosses where a key is beyond its
  threshold, the first divergence as a vertical line;
* :func:`divergence_heatmap_figure`: ``ds.div.heatmap(...)``: layer x step;
* :func:`graft_figure`: :func:`workbench.analysis.divergence.graft`'s Dataset.
"""

from __future__ import annotations

import json

import numpy as np

from workbench.errors import WorkbenchError

__all__ = ["divergence_curves_figure", "divergence_heatmap_figure", "graft_figure"]


def _floor(values: np.ndarray) -> float:
    """Where a log axis draws 0 (bit-identical): a decade below the smallest positive value."""
    pos = values[np.isfinite(values) & (values > 0)]
    return float(pos.min()) / 10 if pos.size else 1e-12


def _need(ds, dims, what: str) -> None:
    if not hasattr(ds, "dims") or "error" not in getattr(ds, "data_vars", {}) or not set(dims) <= set(ds.dims):
        raise WorkbenchError(f"expected the Dataset of {what} (dims {list(dims)} and 'error'), got "
                             f"{type(ds).__name__} {list(getattr(ds, 'dims', []))}", key="ds",
                             fix=f"pass compare_captures(...).to_xarray().{what}")


def divergence_curves_figure(ds, *, x: str = "layer", title: str | None = None):
    """One curve per op (or other leading dims) of ``ds.error`` along ``x`` (log y).

    ``ds`` is ``compare_captures(...).to_xarray().div.curves(...)``. Zero errors (bit-identical
    keys) are drawn a decade below the smallest positive one and say so on hover; layers with a
    key beyond its threshold are crosses; the A/A noise is a grey band when it is noise of the
    drawn metric; the first divergence is a dashed line.
    """
    import plotly.graph_objects as go

    _need(ds, [x], "div.curves(...)")
    err = ds.error
    others = [d for d in err.dims if d != x]
    keys = [k if isinstance(k, tuple) else (k,) for k in err.stack(_k=others)._k.values.tolist()] if others else [()]
    fig = go.Figure()
    band = ds[f"aa_band_{x}"]
    if bool(band.notnull().any()) and json.loads(ds.attrs.get("rule_metrics", "[]")) == [ds.attrs.get("metric")]:
        b = band.dropna(x)
        floor = _floor(b.to_numpy())
        xs = b[x].values.tolist()
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=b.values.tolist() + [floor] * len(xs), fill="toself",
                                 mode="lines",
                                 fillcolor="rgba(120,120,120,0.25)", line=dict(width=0), name="A/A noise",
                                 hoverinfo="skip"))
    zero_at = _floor(err.to_numpy().astype(float))
    name = ds.attrs.get("name", "all")
    for k in keys:
        e, ex = err.sel(dict(zip(others, k))), ds.exceeded.sel(dict(zip(others, k)))
        keep = e.notnull()
        e, ex = e.where(keep, drop=True), ex.where(keep, drop=True)
        if not e.size:
            continue
        v = e.to_numpy().astype(float)
        label = "/".join(str(p) for p in k) or "error"
        fig.add_trace(go.Scatter(
            x=e[x].values, y=np.where(v > 0, v, zero_at), mode="lines+markers",
            name=f"{label}/{name}" if name != "all" and "name" not in others else label,
            customdata=np.where(v > 0, [f"{a:.3e}" for a in v], "0 (bit-identical)"),
            hovertemplate=f"{x} %{{x}}: %{{customdata}}<extra>%{{fullData.name}}</extra>",
            marker=dict(symbol=np.where(ex.to_numpy().astype(bool), "x", "circle").tolist(), size=9)))
    if ds.attrs.get("first_found") and x in ("layer", "step") and int(ds.attrs.get(f"first_{x}", -1)) >= 0:
        fig.add_vline(x=int(ds.attrs[f"first_{x}"]), line_dash="dash", line_color="#cf222e",
                      annotation_text=f"first: {ds.attrs['first_op']}/{ds.attrs['first_name']} "
                                      f"step {ds.attrs['first_step']}", annotation_position="bottom right")
    over = json.loads(ds.attrs.get("reduced", "[]"))
    fig.update_layout(title=title or f"{ds.attrs.get('reduce', 'max')} {ds.attrs.get('metric', '')} per {x}"
                      + (f" (over {', '.join(over)})" if over else ""),
                      xaxis_title=x, yaxis_title=ds.attrs.get("metric", "error"), yaxis_type="log", height=420,
                      margin=dict(l=60, r=20, t=60, b=50), legend=dict(orientation="h", y=-0.2))
    if x in ("layer", "step"):
        fig.update_xaxes(dtick=1)
    return fig


def divergence_heatmap_figure(ds, *, log: bool = True, title: str | None = None):
    """Heatmap of ``ds.error`` over (layer, step) (``compare_captures(...).to_xarray().div.heatmap()``),
    log10 by default; bit-identical cells are blank."""
    import plotly.graph_objects as go

    _need(ds, ["layer", "step"], "div.heatmap(...)")
    e = ds.error.transpose("layer", "step")
    z = e.to_numpy().astype(float)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.log10(np.where(z > 0, z, np.nan))
    metric = ds.attrs.get("metric", "")
    fig = go.Figure(go.Heatmap(z=z, x=[str(v) for v in e.step.values], y=[str(v) for v in e.layer.values],
                               colorscale="Viridis", colorbar=dict(title=("log10 " if log else "") + metric),
                               hovertemplate="layer %{y} step %{x}: %{z:.3g}<extra></extra>"))
    fig.update_layout(title=title or f"{ds.attrs.get('reduce', 'max')} {metric} per layer and step "
                                     f"({ds.attrs.get('op', 'all')})",
                      xaxis_title="step", yaxis_title="layer", height=380, margin=dict(l=60, r=20, t=60, b=50))
    return fig


def graft_figure(ds, *, title: str | None = None):
    """Error per key in causal order for the candidate and the grafted run (``graft`` output),
    the graft position marked."""
    import plotly.graph_objects as go

    fig = go.Figure()
    labels = [f"L{l} {o}/{n} s{s} r{r}" for r, s, l, o, n in zip(ds["rank"].values, ds.step.values, ds.layer.values,
                                                                ds.op.values, ds.name.values)]
    # the candidate as open rings, the grafted run as dots inside them: where a graft changes
    # nothing the dot sits in its ring, where it heals the dot drops below
    marker = {"candidate": dict(symbol="circle-open", size=10, line=dict(width=1.5)), "grafted": dict(size=5)}
    for v in ds.variant.values:
        y = ds.value.sel(variant=v).to_numpy().astype(float)
        fig.add_trace(go.Scatter(x=ds.seq.values, y=np.where(y > 0, y, 1e-16), mode="markers", name=str(v),
                                 marker=marker.get(str(v), {}), text=labels,
                                 hovertemplate="%{text}: %{y:.3e}<extra>%{fullData.name}</extra>"))
    if "graft_seq" in ds.attrs:
        fig.add_vline(x=int(ds.attrs["graft_seq"]), line_dash="dash", annotation_text="graft")
    fig.update_layout(title=title or ds.attrs.get("verdict", "graft"), xaxis_title="seq (causal order)",
                      yaxis_title="rule metric", yaxis_type="log", height=420)
    return fig
