"""A plotly figure that the widgets redraw: an ipywidgets Output whose one display output is the
figure, replaced whole on each update.

Not plotly's FigureWidget: in JupyterLab its view came up blank (0 traces) in 2 of 3 sessions and
stayed blank after the controls changed, while the Python side held the traces (the comm that
syncs the figure to the page lost the race with the view). An Output widget carries the figure as
an ordinary display output, drawn by the same renderer as every other figure in the notebook and
kept with the saved widget state.
"""

from __future__ import annotations


class LiveFigure:
    """``figure``: the plotly Figure drawn now (the Python side, for tests and callers);
    ``widget``: the Output to place in a layout; ``draws``: how many times it was drawn."""

    def __init__(self) -> None:
        import ipywidgets as w
        import plotly.graph_objects as go

        self.figure = go.Figure()
        self.widget = w.Output()
        self.draws = 0

    def show(self, fig) -> None:
        """Draw ``fig`` in place of the figure shown."""
        self.figure = fig
        self.draws += 1
        try:
            from IPython import get_ipython
        except ImportError:  # no IPython: nothing to draw on
            return
        if get_ipython() is None:
            return
        from IPython.display import display

        self.widget.clear_output(wait=True)
        with self.widget:
            display(fig)
