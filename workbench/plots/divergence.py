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
from workbench.plots._style import COLORS, add_status_strip, log_colorbar, log_split, metric_title

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
    keys) cannot sit on a log axis: they are diamonds in a strip under the plot, in their curve's
    colour, and the legend says so; layers with a key beyond its threshold are crosses (legended); the A/A noise is a grey band when it is noise of the
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
        if bool((b > 0).any()):
            b = b.where(b > 0, drop=True)  # where the repeat is bit-identical there is no band to draw
            floor = _floor(b.to_numpy())
            xs = b[x].values.tolist()
            fig.add_trace(go.Scatter(x=xs + xs[::-1], y=b.values.tolist() + [floor] * len(xs), fill="toself",
                                     mode="lines", fillcolor="rgba(120,120,120,0.25)", line=dict(width=0),
                                     name="A/A noise (control vs its repeat)", hoverinfo="skip"))
        else:
            fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", marker=dict(size=0.1, color="#fff"),
                                     name="A/A repeat bit-identical: no noise band"))
    name = ds.attrs.get("name", "all")
    strip = []
    for i, k in enumerate(keys):
        e, ex = err.sel(dict(zip(others, k))), ds.exceeded.sel(dict(zip(others, k)))
        keep = e.notnull()
        e, ex = e.where(keep, drop=True), ex.where(keep, drop=True)
        if not e.size:
            continue
        v = e.to_numpy().astype(float)
        y, zero, _ = log_split(v)
        label = "/".join(str(p) for p in k) or "error"
        label = f"{label}/{name}" if name != "all" and "name" not in others else label
        color = COLORS[i % len(COLORS)]
        fig.add_trace(go.Scatter(
            x=e[x].values, y=y, mode="lines+markers", name=label, legendgroup=label, line=dict(color=color),
            connectgaps=False, customdata=[f"{a:.3e}" for a in v],
            hovertemplate=f"{x} %{{x}}: %{{customdata}}<extra>%{{fullData.name}}</extra>",
            marker=dict(symbol=np.where(ex.to_numpy().astype(bool), "x", "circle").tolist(), size=9, color=color)))
        strip.append(dict(x=e[x].values[zero].tolist(), row="bit-identical", name=f"{label}: bit-identical",
                          color=color, legendgroup=label, showlegend=False))
    add_status_strip(fig, strip, rows=("bit-identical",))
    if bool(ds.exceeded.any()):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="a key beyond its threshold",
                                 marker=dict(symbol="x", color="#888", size=10)))
    if any(len(m["x"]) for m in strip):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="bit-identical (error 0: strip below)",
                                 marker=dict(symbol="diamond", color="#888", size=10)))
    if ds.attrs.get("first_found") and x in ("layer", "step") and int(ds.attrs.get(f"first_{x}", -1)) >= 0:
        fig.add_vline(x=int(ds.attrs[f"first_{x}"]), line_dash="dash", line_color="#cf222e",
                      annotation_text=f"first: {ds.attrs['first_op']}/{ds.attrs['first_name']} "
                                      f"step {ds.attrs['first_step']}", annotation_position="bottom right")
    over = json.loads(ds.attrs.get("reduced", "[]"))
    fig.update_layout(title=title or f"{ds.attrs.get('reduce', 'max')} {metric_title(ds.attrs.get('metric', ''))} per {x}"
                      + (f" (over {', '.join(over)})" if over else ""),
                      xaxis_title=x, yaxis_title=metric_title(ds.attrs.get("metric", "error")), yaxis_type="log",
                      yaxis_exponentformat="e", height=460, margin=dict(l=70, r=20, t=60, b=50), legend=dict(orientation="h", y=-0.2))
    if x in ("layer", "step"):
        fig.update_xaxes(dtick=1)
    return fig


def divergence_heatmap_figure(ds, *, log: bool = True, title: str | None = None):
    """Heatmap of ``ds.error`` over (layer, step) (``compare_captures(...).to_xarray().div.heatmap()``),
    colours on a log scale by default with the values on the colorbar; bit-identical cells (error
    0) grey and cells with no key (not recorded) white, both in the legend; the hover says how
    many keys a cell reduces over, and the title how many keys were left out so that every cell of
    a layer holds the same keys (``div.heatmap(common=True)``)."""
    import plotly.graph_objects as go

    _need(ds, ["layer", "step"], "div.heatmap(...)")
    e = ds.error.transpose("layer", "step")
    z = e.to_numpy().astype(float)
    metric = ds.attrs.get("metric", "")
    if log:
        zc, colorbar = log_colorbar(z, unit=metric_title(metric))
    else:
        zc, colorbar = np.where(z > 0, z, np.nan), dict(title=metric_title(metric))
    n = ds.n_keys.transpose("layer", "step").to_numpy() if "n_keys" in ds else np.zeros_like(z)
    xs, ys = [str(v) for v in e.step.values], [str(v) for v in e.layer.values]
    text = np.where(np.isfinite(z), np.char.add(np.char.mod("%.3e", np.nan_to_num(z)), ""), "not recorded")
    text = np.where(np.isfinite(z) & (z <= 0), "0 (bit-identical)", text)
    custom = np.dstack([text, n.astype(int).astype(str)])
    fig = go.Figure(go.Heatmap(z=zc, x=xs, y=ys, colorscale="Viridis", colorbar=colorbar, customdata=custom,
                               hovertemplate="layer %{y} step %{x}: %{customdata[0]} "
                                             "(%{customdata[1]} keys)<extra></extra>"))
    zero = np.isfinite(z) & (z <= 0)
    if zero.any():
        fig.add_trace(go.Heatmap(z=np.where(zero, 1.0, np.nan), x=xs, y=ys, showscale=False, hoverinfo="skip",
                                 colorscale=[[0, "#c8c8c8"], [1, "#c8c8c8"]]))
    fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="bit-identical (error 0)",
                             marker=dict(symbol="square", size=12, color="#c8c8c8")))
    if (~np.isfinite(z)).any():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name="not recorded",
                                 marker=dict(symbol="square-open", size=12, color="#888")))
    left = int(ds.attrs.get("n_left_out", 0))
    sub = (f"<br><sup>each layer's cells reduce over the same keys ({left} key(s) recorded only at some "
           f"steps left out)</sup>" if int(ds.attrs.get("common", 0)) else "")
    fig.update_layout(title=(title or f"{ds.attrs.get('reduce', 'max')} {metric_title(metric)} per layer and step "
                                      f"({ds.attrs.get('op', 'all')})") + sub,
                      xaxis_title="step", yaxis_title="layer", height=420, plot_bgcolor="white", showlegend=True,
                      margin=dict(l=60, r=20, t=80, b=50), legend=dict(orientation="h", y=-0.18))
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
    strip = []
    for i, v in enumerate(ds.variant.values):
        y, zero, missing = log_split(ds.value.sel(variant=v).to_numpy())
        color = COLORS[i % len(COLORS)]
        fig.add_trace(go.Scatter(x=ds.seq.values, y=y, mode="markers", name=str(v), legendgroup=str(v),
                                 marker={**marker.get(str(v), {}), "color": color}, text=labels,
                                 hovertemplate="%{text}: %{y:.3e}<extra>%{fullData.name}</extra>"))
        strip.append(dict(x=ds.seq.values[zero].tolist(), row="bit-identical", name=f"{v}: bit-identical",
                          color=color, legendgroup=str(v), text=[t for t, z in zip(labels, zero) if z]))
    add_status_strip(fig, strip, rows=("bit-identical",))
    if "graft_seq" in ds.attrs:
        fig.add_vline(x=int(ds.attrs["graft_seq"]), line_dash="dash", annotation_text="graft")
    fig.update_layout(title=title or ds.attrs.get("verdict", "graft"), xaxis_title="seq (causal order)",
                      yaxis_title=metric_title("value"), yaxis_type="log", yaxis_exponentformat="e", height=460)
    return fig
