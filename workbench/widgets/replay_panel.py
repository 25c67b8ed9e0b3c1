"""ReplayPanel: pick backends and policy knobs, replay a captured op, see the errors."""

from __future__ import annotations

from workbench.analysis.replay import replay
from workbench.numerics.policy import Policy
from workbench.plots.replay import replay_figure
from workbench.widgets._figure import LiveFigure

__all__ = ["ReplayPanel"]

KNOBS = {"state_dtype": ["fp32", "bf16", "fp16"], "input_dtype": [None, "bf16", "fp16"],
         "prob_dtype": ["fp32", "fp16", "bf16"], "num_kv_splits": [1, 2, 4, 8]}


class ReplayPanel:
    """Backends (multi-select) and one value per policy knob; "Replay" runs
    :func:`workbench.analysis.replay` with the default policy and the chosen one.

    Example
    -------
    >>> panel = ReplayPanel("captures/control", op="gdn", layer=0, rank=0)    # doctest: +SKIP
    >>> panel.knobs["state_dtype"].value = "bf16"; panel.run()                # doctest: +SKIP
    """

    def __init__(self, capture, *, op: str = "gdn", backends=("torch", "oracle", "ext"), max_cases: int | None = 8,
                 **filters) -> None:
        import ipywidgets as w

        self.capture, self.op, self.filters, self.max_cases = capture, op, filters, max_cases
        self.backends = w.SelectMultiple(options=list(backends), value=(backends[0],), description="backends")
        self.knobs = {k: w.Dropdown(options=v, value=getattr(Policy(), k), description=k) for k, v in KNOBS.items()}
        self.button = w.Button(description="Replay")
        self.button.on_click(lambda _b: self.run())
        self.status = w.HTML()
        self.figure = LiveFigure()
        self.result = None
        self.widget = w.VBox([w.HBox([self.backends, w.VBox(list(self.knobs.values()))]), self.button, self.status,
                              self.figure.widget])

    def policy(self) -> Policy:
        return Policy().replace(**{k: c.value for k, c in self.knobs.items()})

    def run(self):
        """Replay with the default policy and the chosen one; update the figure in place."""
        pols = {"default": Policy()}
        chosen = self.policy()
        if chosen != Policy():
            pols[chosen.label()] = chosen
        try:
            self.result = replay(self.capture, op=self.op, backends=tuple(self.backends.value), policies=pols,
                                 max_cases=self.max_cases, **self.filters)
        except Exception as e:  # shown, not raised: a callback has nowhere to raise to
            self.status.value = f"<b>replay failed</b>: {e}"
            return None
        self.status.value = (f"{self.result.attrs['n_cases']} cases; skipped: {self.result.attrs['skipped']}")
        self.figure.show(replay_figure(self.result))
        return self.result
