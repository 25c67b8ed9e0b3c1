"""What every figure shares so that none misleads: axis titles in words, and values a log axis
cannot show (zero: bit-identical; NaN: skipped or not recorded) drawn in a strip of their own
under the plot, in the colour of their series and said in the legend, never clamped into the
data range.
"""

from __future__ import annotations

import numpy as np

__all__ = ["COLORS", "METRIC_TITLES", "metric_title", "log_split", "add_status_strip", "log_colorbar"]

COLORS = ["#636efa", "#ef553b", "#00cc96", "#ab63fa", "#ffa15a", "#19d3f3", "#ff6692", "#b6e880", "#ff97ff",
          "#fecb52"]  # plotly's own sequence, named so that a strip marker takes its series' colour

METRIC_TITLES = {
    "rel_l2": "relative L2 error (‖cand − ctrl‖ / ‖ctrl‖)",
    "max_abs": "largest absolute difference",
    "mean_abs": "mean absolute difference",
    "max_ulp": "largest difference in ULPs of the stored dtype",
    "median_ulp": "median difference in ULPs of the stored dtype",
    "frac_outside": "fraction of elements outside the tolerance",
    "value": "rule metric of each key",
    "err_oracle": "relative L2 error against FP64",
    "err_captured": "relative L2 error against the captured output",
    "rel_err_max": "relative L2 error of the state (worst head)",
    "rel_err": "relative L2 error of the state",
    "state_err": "relative L2 error of the state against FP64",
    "per_head": "relative L2 error of the state (each head)",
    "control_err_oracle": "relative L2 error of the control against FP64",
    "max_abs_logits": "largest absolute difference of the logits",
    "out_err": "relative L2 error of the output against FP64",
    "between": "relative L2 difference between the two variants",
    "fails": "share of rows whose token flips",
    "fails_control": "share of rows whose token differs from the control's",
    "partial_cause": "share of flips caused by the partial dtype",
}


def metric_title(metric: str) -> str:
    """The words for a metric variable (the variable's own name when none are known)."""
    return METRIC_TITLES.get(str(metric), str(metric).replace("_", " "))


def log_split(values) -> tuple[list, np.ndarray, np.ndarray]:
    """``values`` for a log axis: (y with None where a value cannot be drawn, zero mask, NaN mask)."""
    v = np.asarray(values, dtype=float)
    zero = np.isfinite(v) & (v <= 0)
    missing = ~np.isfinite(v)
    y = [float(a) if ok else None for a, ok in zip(v.tolist(), (~zero & ~missing).tolist())]
    return y, zero, missing


STRIP = "y9"  # the strip's axis: far from the axes a figure's own subplots use


def add_status_strip(fig, marks: list[dict], *, rows: tuple[str, ...] = ("bit-identical", "not computed")) -> None:
    """Put ``marks`` in a strip under the plot: each a dict with ``x``, ``row`` (one of ``rows``),
    ``name`` (legend text), ``color`` and optional ``legendgroup`` / ``text`` (hover). Nothing is
    added when ``marks`` holds no point; the x axis then stays where it was."""
    import plotly.graph_objects as go

    marks = [m for m in marks if len(m["x"])]
    if not marks:
        return
    used = [r for r in rows if any(m["row"] == r for m in marks)]
    symbol = {"bit-identical": "diamond", "not computed": "x-thin-open", "skipped": "x-thin-open"}
    for m in marks:
        xs = list(m["x"])
        fig.add_trace(go.Scatter(
            x=xs, y=[m["row"]] * len(xs), yaxis=STRIP, mode="markers", name=m["name"],
            legendgroup=m.get("legendgroup"), showlegend=m.get("showlegend", True),
            marker=dict(symbol=symbol.get(m["row"], "diamond"), size=10, color=m["color"],
                        line=dict(width=1.5, color=m["color"])),
            text=m.get("text"), hovertemplate="%{x}: " + m["row"] + "<extra>%{fullData.name}</extra>"))
    fig.update_layout(**{
        "yaxis": dict(domain=[0.16 + 0.04 * len(used), 1]),
        "yaxis9": dict(domain=[0, 0.04 + 0.05 * len(used)], type="category", categoryorder="array",
                       categoryarray=list(used), showgrid=False, fixedrange=True, zeroline=False, anchor="x"),
        "xaxis": dict(anchor=STRIP)})


def log_colorbar(z, *, unit: str) -> tuple[np.ndarray, dict]:
    """log10 of ``z`` (positive values; others NaN) and a colorbar whose ticks say the values
    (``1e-5``, ``1e9``) and ``unit``."""
    z = np.asarray(z, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        lz = np.log10(np.where(np.isfinite(z) & (z > 0), z, np.nan))
    if not np.isfinite(lz).any():
        return lz, dict(title=unit)
    zmin, zmax = float(np.nanmin(lz)), float(np.nanmax(lz))
    lo, hi = int(np.floor(zmin)), int(np.ceil(zmax))
    step = max(1, (hi - lo + 5) // 6)
    ticks = [float(t) for t in range(lo, hi + 1, step)]
    if hi - lo < 3:  # a narrow range: 2 and 5 of each decade too
        ticks = [t + np.log10(m) for t in ticks for m in (1, 2, 5)]
    ticks = [t for t in ticks if zmin - 1e-9 <= t <= zmax + 1e-9]
    if len(ticks) < 3:  # narrower still: the ends and two values between, as numbers
        ticks = np.linspace(zmin, zmax, 4).tolist() if zmax > zmin else [zmin]
        return lz, dict(title=unit, tickvals=ticks, ticktext=[f"{10 ** t:.2g}" for t in ticks])
    return lz, dict(title=unit, tickvals=ticks, ticktext=[_exp_text(10 ** t) for t in ticks])


def _exp_text(v: float) -> str:
    """1e-05 -> '1e-5', 2e+08 -> '2e8'."""
    m, e = f"{v:.0e}".split("e")
    return f"{m}e{int(e)}"
