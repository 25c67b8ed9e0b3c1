"""GraftPanel: pick an op and the tensors of it to take from the control, re-run the candidate
with them grafted in, and see every key's error move (:func:`workbench.analysis.divergence.graft`)."""

from __future__ import annotations

import html
from typing import Callable, Mapping

import torch

from workbench.analysis.compare import compare_captures
from workbench.analysis.divergence import graft
from workbench.capture.reader import Capture, open_capture
from workbench.errors import AnalysisError
from workbench.plots.divergence import graft_figure
from workbench.widgets._figure import LiveFigure

__all__ = ["GraftPanel"]


class GraftPanel:
    """An op (every op whose tensors differ from the control's at all, in causal order, the first
    divergence's marked and chosen), the tensors of it to graft from the control (``input`` by
    default: is the op itself at fault?; ``output``: does everything after it agree?) and a
    "Graft" button: the candidate is re-run with them replaced, compared with the control, and the
    figure (each key's rule metric, candidate against grafted, in causal order) and the verdict
    update in place.

    Parameters
    ----------
    rerun: ``rerun(overrides) -> Capture`` of the candidate arm (``ModelRerun``, ``HybridRerun``)
    control: the control capture (or path): the source of the grafted tensors and the reference
    candidate: the un-grafted candidate capture (default ``rerun({})``)
    aa, rules: as in :func:`workbench.analysis.compare_captures`
    max_ops: list at most this many ops (the earliest)

    Example
    -------
    >>> panel = GraftPanel(ModelRerun(model, run), control_capture)             # doctest: +SKIP
    >>> display(panel.widget)                                                  # doctest: +SKIP
    >>> panel.choose(panel.ops[0], ["output"]); panel.run().attrs["verdict"]  # doctest: +SKIP
    """

    def __init__(self, rerun: Callable[[Mapping[tuple, torch.Tensor]], Capture], control, *, candidate=None,
                 aa=None, rules=None, max_ops: int = 200) -> None:
        import ipywidgets as w

        self.rerun, self.aa, self.rules = rerun, aa, rules
        self.control = control if isinstance(control, Capture) else open_capture(control)
        base = candidate if candidate is not None else rerun({})
        self.candidate = base if isinstance(base, Capture) else open_capture(base)
        before = compare_captures(self.control, self.candidate, aa=aa, rules=rules)
        t = before.table[~before.table["status"].isin(["only_control", "only_candidate"])].sort_values("seq")
        differ = t[t["value"] > 0]
        first = before.first_divergence()
        self.first = None if first is None else tuple(int(first[k]) for k in ("rank", "step", "layer")) + (str(first["op"]),)
        ops: list[tuple] = []
        for r, s, l, o in differ[["rank", "step", "layer", "op"]].itertuples(index=False):
            k = (int(r), int(s), int(l), str(o))
            if k not in ops:
                ops.append(k)
        self.ops = ops[:max_ops]
        labels = [(self._label(k), k) for k in self.ops]
        self.op = w.Dropdown(options=labels, value=self.first if self.first in self.ops else (self.ops[0] if self.ops else None),
                             description="op", layout=w.Layout(width="520px"))
        self.names = w.SelectMultiple(options=[], description="graft", rows=6)
        self.button = w.Button(description="Graft", button_style="primary", disabled=not self.ops)
        self.button.on_click(lambda _b: self.run())
        self.status = w.HTML(value=("pick an op and the tensors to take from the control, then Graft"
                                    if self.ops else "no key differs from the control: nothing to graft"))
        self.figure = LiveFigure()
        self.result = None
        self.op.observe(lambda _c: self._fill_names(), names="value")
        self._fill_names()
        self.widget = w.VBox([w.HBox([self.op, self.names, self.button]), self.status, self.figure.widget])
        self.widget.add_class("workbench-graft-panel")

    def _label(self, k: tuple) -> str:
        r, s, l, o = k
        return f"layer {l} {o} (step {s}, rank {r})" + ("  <- first divergence" if k == self.first else "")

    def names_of(self, k: tuple) -> list[str]:
        """The control's tensor names of op ``k`` = (rank, step, layer, op), in causal order."""
        idx = self.control.index
        r, s, l, o = k
        m = (idx["rank"] == r) & (idx["step"] == s) & (idx["layer"] == l) & (idx["op"] == o)
        return idx[m].sort_values("seq")["name"].tolist()

    def _fill_names(self) -> None:
        k = self.op.value
        names = self.names_of(k) if k is not None else []
        self.names.options = names
        pick = [n for n in ("input",) if n in names] or names[:1]
        self.names.value = tuple(pick)

    def choose(self, op: tuple, names) -> None:
        """Select ``op`` (one of :attr:`ops`) and the tensor ``names`` of it to graft."""
        if tuple(op) not in self.ops:
            raise AnalysisError(f"op {op!r} is not one of the ops that differ", key="op",
                                fix=f"choose one of {self.ops[:5]}{' ...' if len(self.ops) > 5 else ''}")
        self.op.value = tuple(op)
        missing = sorted(set(names) - set(self.names.options))
        if missing:
            raise AnalysisError(f"op {op!r} has no tensor(s) {missing} in the control", key="names",
                                fix=f"choose from {list(self.names.options)}")
        self.names.value = tuple(names)

    def run(self):
        """Graft the chosen tensors, re-run, compare; update the verdict and the figure in place."""
        if self.op.value is None or not self.names.value:
            self.status.value = "pick an op and at least one tensor to graft"
            return None
        r, s, l, o = self.op.value
        self.status.value = f"re-running with {', '.join(self.names.value)} of layer {l} {o} from the control ..."
        try:
            self.result = graft(self.rerun, self.control, at=dict(rank=r, step=s, layer=l, op=o),
                                replace=list(self.names.value), candidate=self.candidate, aa=self.aa, rules=self.rules)
        except Exception as e:  # shown, not raised: a callback has nowhere to raise to
            self.status.value = f"<b>graft failed</b>: {html.escape(str(e))}"
            return None
        a = self.result.attrs
        self.status.value = (f"<b>{html.escape(a['verdict'])}</b><br>before: {html.escape(a['first_before'])}<br>"
                             f"after: {html.escape(a['first_after'])}")
        self.figure.show(graft_figure(self.result))
        return self.result
