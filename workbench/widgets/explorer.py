"""CaptureExplorer: pick layer, op, name, step, rank and a metric; the figures follow."""

from __future__ import annotations

from workbench.analysis.compare import METRICS, compare_captures
from workbench.errors import WorkbenchError
from workbench.plots.divergence import divergence_curves_figure
from workbench.widgets._figure import LiveFigure

__all__ = ["CaptureExplorer"]

ALL = "(all)"


class CaptureExplorer:
    """Dropdowns over the keys of a control/candidate comparison, wired to two figures: the error
    per layer (for the chosen op, name, step, rank) and the error per step (for the chosen layer).

    Example
    -------
    >>> ex = CaptureExplorer("captures/control", "captures/candidate", aa="captures/control-repeat")  # doctest: +SKIP
    >>> ex.widget                                     # display in a notebook              # doctest: +SKIP
    >>> ex.controls["op"].value = "qsa"               # the figures update in place        # doctest: +SKIP
    """

    def __init__(self, control, candidate, *, aa=None, rules=None, **filters) -> None:
        import ipywidgets as w

        self.result = compare_captures(control, candidate, aa=aa, rules=rules, **filters)
        self.ds = self.result.to_xarray()
        t = self.result.table
        t = t[t["seq"] >= 0]

        def opts(col):
            return [ALL] + sorted(t[col].unique().tolist())

        first = self.result.first_divergence()
        self.controls = {
            "op": w.Dropdown(options=opts("op"), value=first["op"] if first is not None else ALL, description="op"),
            "name": w.Dropdown(options=opts("name"), value="output" if "output" in set(t["name"]) else ALL,
                               description="name"),
            "layer": w.Dropdown(options=opts("layer"), value=ALL, description="layer"),
            "step": w.Dropdown(options=opts("step"), value=ALL, description="step"),
            "rank": w.Dropdown(options=opts("rank"), value=ALL, description="rank"),
            "metric": w.Dropdown(options=list(METRICS), value="rel_l2", description="metric"),
        }
        self.by_layer = LiveFigure()
        self.by_step = LiveFigure()
        self.status = w.HTML()
        for c in self.controls.values():
            c.observe(self._changed, names="value")
        self.widget = w.VBox([w.HBox(list(self.controls.values())[:3]), w.HBox(list(self.controls.values())[3:]),
                              self.status, self.by_layer.widget, self.by_step.widget])
        self.widget.add_class("workbench-capture-explorer")  # a handle for pages and tests
        self.update()

    def _filters(self, drop: str) -> dict:
        return {k: c.value for k, c in self.controls.items()
                if k not in ("metric", "name", drop) and c.value != ALL}

    def _changed(self, _change) -> None:
        self.update()

    def update(self) -> None:
        """Recompute both figures from the current selection (analysis calls only)."""
        name = self.controls["name"].value
        name = None if name == ALL else name
        metric = self.controls["metric"].value
        msgs = [self.result.describe_first()]
        for fig, dim in ((self.by_layer, "layer"), (self.by_step, "step")):
            try:
                curves = self.ds.div.curves(metric=metric, by=("op", dim), name=name, **self._filters(dim))
                fig.show(divergence_curves_figure(curves, x=dim))
            except WorkbenchError as e:  # an empty selection: say so instead of raising in a callback
                msgs.append(f"{dim}: {str(e).splitlines()[0]}")
                fig.show(_empty())
        self.status.value = "<br>".join(msgs)


def _empty():
    import plotly.graph_objects as go
    return go.Figure()
