"""Figures of a :class:`~workbench.analysis.compare.ComparisonResult`: per-layer curves with the
A/A noise band, and a layer x step heatmap.

Both take the result (or its ``.table``) and reduce with the maximum over the other key fields,
which is what "how far apart are the runs at this layer" means for a first-divergence hunt.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from workbench.errors import WorkbenchError

__all__ = ["layer_curves", "layer_step_heatmap", "per_layer", "divergence_curves_figure",
           "divergence_heatmap_figure", "graft_figure"]


def _table(res) -> pd.DataFrame:
    t = getattr(res, "table", res)
    if not isinstance(t, pd.DataFrame):
        raise WorkbenchError(f"expected a ComparisonResult or its table, got {type(res).__name__}",
                             key="res", fix="pass compare_captures(...) or its .table")
    return t[t["status"].isin(["ok", "diverged", "dtype_mismatch", "nonfinite"])]


def _check_metric(t: pd.DataFrame, metric: str) -> None:
    if metric not in t.columns:
        numeric = [c for c in t.columns if pd.api.types.is_float_dtype(t[c])]
        raise WorkbenchError(f"unknown metric {metric!r}", key="metric", fix=f"use one of {numeric}")


def per_layer(res, *, metric: str = "rel_l2", ops=None, name: str | None = "output") -> pd.DataFrame:
    """Max of ``metric`` per (op, layer) over steps and ranks, with the A/A noise (``aa``, only
    meaningful for the result's rule metric) and the threshold; layer -1 (no layer) excluded."""
    t = _table(res)
    _check_metric(t, metric)
    t = t[t["layer"] >= 0]
    if name is not None:
        t = t[t["name"] == name]
    if ops is not None:
        t = t[t["op"].isin([ops] if isinstance(ops, str) else list(ops))]
    return (t.groupby(["op", "layer"], sort=True)
             .agg(value=(metric, "max"), aa=("aa", "max"), threshold=("threshold", "max"),
                  exceeded=("exceeded", "any"))
             .reset_index())


def layer_curves(res, *, metric: str = "rel_l2", ops=("mix", "mlp", "layer"), name: str | None = "output",
                 first=None, title: str | None = None):
    """One curve per op of max ``metric`` against layer (log y), the A/A noise as a shaded band
    and the first divergence as a vertical line.

    Parameters
    ----------
    res: ComparisonResult (or its table)
    metric: a metric column of the table (rel_l2, max_abs, max_ulp, ...)
    ops: the ops to draw (None: all); name: the tensor name to keep (None: all)
    first: the first divergence row (default ``res.first_divergence()`` when available)
    """
    import plotly.graph_objects as go

    d = per_layer(res, metric=metric, ops=ops, name=name)
    fig = go.Figure()
    # the A/A column holds the noise of each row's rule metric: draw it only when that is `metric`
    if len(d) and set(_table(res)["metric"].unique()) == {metric}:
        band = d.groupby("layer")["aa"].max().dropna()
        if len(band):
            floor = float(band[band > 0].min()) / 10 if (band > 0).any() else 1e-12
            fig.add_trace(go.Scatter(x=list(band.index) + list(band.index[::-1]),
                                     y=list(band.values) + [floor] * len(band),
                                     fill="toself", fillcolor="rgba(120,120,120,0.25)",
                                     line=dict(width=0), hoverinfo="skip", name="A/A noise"))
    pos = d["value"][d["value"] > 0]
    zero_at = float(pos.min()) / 10 if len(pos) else 1e-12  # log axis: bit-identical drawn just below
    for op, g in d.groupby("op", sort=False):
        y = g["value"].where(g["value"] > 0, zero_at)
        fig.add_trace(go.Scatter(x=g["layer"], y=y, mode="lines+markers", name=f"{op}/{name}" if name else op,
                                 customdata=np.where(g["value"] > 0, g["value"].map("{:.3e}".format), "0 (bit-identical)"),
                                 hovertemplate="layer %{x}: %{customdata}<extra>%{fullData.name}</extra>",
                                 marker=dict(symbol=np.where(g["exceeded"], "x", "circle").tolist(), size=9)))
    if first is None and hasattr(res, "first_divergence"):
        first = res.first_divergence()
    if first is not None and int(first["layer"]) >= 0:
        fig.add_vline(x=int(first["layer"]), line_dash="dash", line_color="#cf222e",
                      annotation_text=f"first: {first['op']}/{first['name']} step {first['step']}",
                      annotation_position="bottom right")
    fig.update_layout(title=title or f"max {metric} per layer (over steps and ranks)",
                      xaxis_title="layer", yaxis_title=metric, yaxis_type="log",
                      height=420, margin=dict(l=60, r=20, t=60, b=50), legend=dict(orientation="h", y=-0.2))
    fig.update_xaxes(dtick=1)
    return fig


def layer_step_heatmap(res, *, metric: str = "rel_l2", op: str | None = None, name: str | None = None,
                       log: bool = True, title: str | None = None):
    """Heatmap of max ``metric`` over (layer, step), log10 by default; layer -1 excluded."""
    import plotly.graph_objects as go

    t = _table(res)
    _check_metric(t, metric)
    t = t[t["layer"] >= 0]
    if op is not None:
        t = t[t["op"] == op]
    if name is not None:
        t = t[t["name"] == name]
    if not len(t):
        raise WorkbenchError("no rows to draw", key=f"op={op} name={name}",
                             fix="check op/name against the table's values")
    z = t.pivot_table(index="layer", columns="step", values=metric, aggfunc="max").sort_index()
    vals = z.to_numpy(dtype=float)
    if log:
        with np.errstate(divide="ignore"):
            vals = np.log10(np.where(vals > 0, vals, np.nan))
    fig = go.Figure(go.Heatmap(z=vals, x=[str(s) for s in z.columns], y=[str(l) for l in z.index],
                               colorscale="Viridis",
                               colorbar=dict(title=f"log10 {metric}" if log else metric),
                               hovertemplate="layer %{y} step %{x}: %{z:.3g}<extra></extra>"))
    fig.update_layout(title=title or f"max {metric} per layer and step" + (f" ({op})" if op else ""),
                      xaxis_title="step", yaxis_title="layer", height=380,
                      margin=dict(l=60, r=20, t=60, b=50))
    return fig


# -- figures of the xarray results of workbench.analysis.divergence ----------------------------

def divergence_curves_figure(ds, *, x: str = "layer", title: str | None = None):
    """One curve per op (or other leading dim) of ``ds.error`` along ``x`` (log y), the A/A noise
    as a shaded band, the first divergence as a vertical line (``divergence_curves`` output)."""
    import plotly.graph_objects as go

    if x not in ds.dims:
        raise WorkbenchError(f"x must be a dim of the Dataset {list(ds.dims)}, got {x!r}", key="x",
                             fix="pass x='layer' (or 'step')")
    err = ds.error
    others = [d for d in err.dims if d != x]
    series = [((), err)] if not others else \
        [(k, err.sel(dict(zip(others, k)))) for k in
         (err.stack(_k=others)._k.values.tolist() if len(others) > 1 else [(v,) for v in err[others[0]].values])]
    fig = go.Figure()
    band = ds.aa.max(others) if others else ds.aa
    if bool(band.notnull().any()) and json.loads(ds.attrs.get("rule_metrics", "[]")) == [ds.attrs.get("metric")]:
        b = band.dropna(x)
        floor = float(b.where(b > 0).min()) / 10 if bool((b > 0).any()) else 1e-12
        xs = b[x].values.tolist()
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=b.values.tolist() + [floor] * len(xs), fill="toself",
                                 fillcolor="rgba(120,120,120,0.25)", line=dict(width=0), name="A/A noise",
                                 hoverinfo="skip"))
    for k, e in series:
        e = e.dropna(x)
        if not e.size:
            continue
        y = e.where(e > 0, 1e-16)
        fig.add_trace(go.Scatter(x=e[x].values, y=y.values, mode="lines+markers",
                                 name="/".join(str(v) for v in k) or "error"))
    if ds.attrs.get("first_found") and x in ("layer", "step") and int(ds.attrs.get(f"first_{x}", -1)) >= 0:
        fig.add_vline(x=int(ds.attrs[f"first_{x}"]), line_dash="dash", line_color="#cf222e",
                      annotation_text=f"first: {ds.attrs['first_op']}/{ds.attrs['first_name']}")
    fig.update_layout(title=title or f"{ds.attrs.get('reduce', 'max')} {ds.attrs.get('metric', '')} per {x}",
                      xaxis_title=x, yaxis_title=ds.attrs.get("metric", "error"), yaxis_type="log", height=420)
    return fig


def divergence_heatmap_figure(ds, *, log: bool = True, title: str | None = None):
    """Heatmap of ``ds.error`` over (layer, step) (``divergence_heatmap`` output), log10 by default."""
    import plotly.graph_objects as go

    e = ds.error.transpose("layer", "step")
    z = e.to_numpy().astype(float)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.log10(np.where(z > 0, z, np.nan))
    fig = go.Figure(go.Heatmap(z=z, x=[str(v) for v in e.step.values], y=[str(v) for v in e.layer.values],
                               colorscale="Viridis",
                               colorbar=dict(title=("log10 " if log else "") + ds.attrs.get("metric", ""))))
    fig.update_layout(title=title or f"{ds.attrs.get('metric', '')} per layer and step ({ds.attrs.get('op', 'all')})",
                      xaxis_title="step", yaxis_title="layer", height=380)
    return fig


def graft_figure(ds, *, title: str | None = None):
    """Error per key in causal order for the candidate and the grafted run (``graft`` output),
    the graft position marked."""
    import plotly.graph_objects as go

    fig = go.Figure()
    labels = [f"L{l} {o}/{n} s{s} r{r}" for r, s, l, o, n in zip(ds["rank"].values, ds.step.values, ds.layer.values,
                                                                ds.op.values, ds.name.values)]
    for v in ds.variant.values:
        y = ds.value.sel(variant=v).to_numpy().astype(float)
        fig.add_trace(go.Scatter(x=ds.seq.values, y=np.where(y > 0, y, 1e-16), mode="markers", name=str(v),
                                 text=labels, hovertemplate="%{text}: %{y:.3e}<extra>%{fullData.name}</extra>"))
    if "graft_seq" in ds.attrs:
        fig.add_vline(x=int(ds.attrs["graft_seq"]), line_dash="dash", annotation_text="graft")
    fig.update_layout(title=title or ds.attrs.get("verdict", "graft"), xaxis_title="seq (causal order)",
                      yaxis_title="rule metric", yaxis_type="log", height=420)
    return fig
