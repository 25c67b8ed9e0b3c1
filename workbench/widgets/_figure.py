"""A plotly figure that updates in place: a FigureWidget when anywidget is installed, else a
Figure shown in an Output widget and re-shown after each update."""

from __future__ import annotations


class LiveFigure:
    def __init__(self) -> None:
        import ipywidgets as w
        import plotly.graph_objects as go
        try:
            self.figure = go.FigureWidget()
            self.widget = self.figure
            self._out = None
        except ImportError:  # plotly's FigureWidget needs anywidget
            self.figure = go.Figure()
            self._out = w.Output()
            self.widget = self._out

    def show(self, fig) -> None:
        """Replace traces and layout of the live figure by those of ``fig``, in place."""
        with self.figure.batch_update() if hasattr(self.figure, "batch_update") else _null():
            self.figure.data = []
            self.figure.add_traces(list(fig.data))
            self.figure.layout = fig.layout
        if self._out is not None:
            self._out.clear_output(wait=True)
            with self._out:
                self.figure.show()


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False
