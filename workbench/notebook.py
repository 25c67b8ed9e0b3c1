"""Notebook helpers: setup, repo-relative paths, gates (recorded checks) and their assertion.

A notebook of the workbench starts with::

    from workbench import notebook as nb
    nb.setup()

and ends with ``nb.assert_gates()``. In between, every check that CI should enforce is a *gate*::

    nb.gate("aa_noise_rel_l2", value=noise, threshold=max_aa_rel_l2)          # value <= threshold
    nb.gate("first_divergence_layer", value=layer, threshold=3, op="==")

Gates are of two kinds (``kind``): *regression* gates need no planted answer (the A/A repeat
agrees, no key diverges, the tokens agree) and *expectation* gates compare a finding with an
expected value that the user gave (a parameter) or that a bundled capture carries:
:func:`expect` records one only when an expectation exists, and otherwise only reports the
finding. What a notebook found is stated in words with :func:`finding`; ``workbench run``
collects the findings into results.json and index.html.

A gate is displayed as a cell output carrying a machine-readable record (mimetype
:data:`GATE_MIMETYPE`: name, value, threshold, op, passed) next to a readable line, so the
executed notebook itself is the record: ``workbench run`` reads the gates back from the outputs,
knows in which cell each was recorded, and writes them to its results JSON. ``assert_gates()``
in the last cell raises :class:`~workbench.errors.GateError` naming every failed gate, after every
figure has been drawn.
"""

from __future__ import annotations

import html
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from workbench.errors import GateError, WorkbenchError

__all__ = ["GATE_MIMETYPE", "FINDING_MIMETYPE", "Gate", "setup", "repo_root", "resolve", "gate", "gates", "resolve_tensor_file",
           "expect", "expectations", "finding", "findings", "skipped", "device", "backends_on", "reset_gates", "assert_gates", "show", "explore",
           "offline_explorer"]

GATE_MIMETYPE = "application/vnd.workbench.gate+json"
FINDING_MIMETYPE = "application/vnd.workbench.finding+json"
CWD_ENV = "WORKBENCH_CWD"
ROOT_ENV = "WORKBENCH_ROOT"

_OPS = {
    "<=": lambda v, t: v <= t,
    "<": lambda v, t: v < t,
    ">=": lambda v, t: v >= t,
    ">": lambda v, t: v > t,
    "==": lambda v, t: v == t,
    "!=": lambda v, t: v != t,
}


@dataclass(frozen=True)
class Gate:
    """One recorded check: ``passed`` is ``value <op> threshold`` (NaN never passes)."""

    name: str
    value: Any
    threshold: Any
    op: str = "<="
    passed: bool = True
    help: str = ""
    kind: str = "regression"  # or "expectation"

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return f"{self.kind} gate {self.name}: {verdict}  {_fmt(self.value)} {self.op} {_fmt(self.threshold)}" + (
            f"  ({self.help})" if self.help else "")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["value"], d["threshold"] = _jsonable(self.value), _jsonable(self.threshold)
        return d


_GATES: dict[str, Gate] = {}


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return repr(x) if isinstance(x, str) else str(x)


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item") and callable(x.item):  # numpy / torch scalars
        try:
            x = x.item()
        except (TypeError, ValueError):
            pass
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)  # JSON has no NaN/Inf
    if isinstance(x, (bool, int, float, str)) or x is None:
        return x
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    return str(x)


# -- setup and paths -----------------------------------------------------------------------------

def repo_root(start: str | os.PathLike | None = None) -> Path:
    """The workbench checkout: ``$WORKBENCH_ROOT`` or the first folder above ``start`` (default:
    the working directory) that holds both ``notebooks/`` and ``captures/``; else ``start``."""
    env = os.environ.get(ROOT_ENV)
    if env:
        return Path(env).resolve()
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if (d / "notebooks").is_dir() and (d / "captures").is_dir():
            return d
    return here


def resolve(path: str | os.PathLike) -> Path:
    """A notebook parameter path, as any command-line tool reads one: absolute as given, relative
    to the directory the user ran from (``workbench run`` passes it as ``$WORKBENCH_CWD``; in
    JupyterLab the notebook's folder). Only a relative path that does not exist there is looked
    up in the repository root (:func:`repo_root`), so the bundled defaults (``captures/control``)
    work from anywhere."""
    p = Path(os.path.expanduser(str(path)))
    if p.is_absolute():
        return p
    here = Path(os.environ.get(CWD_ENV) or os.getcwd()) / p
    if here.exists():
        return here
    bundled = repo_root() / p
    return bundled if bundled.exists() else here


def resolve_tensor_file(spec: str) -> str:
    """``"path.safetensors:tensor"`` with the path resolved as :func:`resolve` does (the user's
    working directory); any other spec (``"op/name"``, ``""``) is returned unchanged."""
    path, sep, key = str(spec or "").rpartition(":")
    if sep and path.endswith(".safetensors"):
        return f"{resolve(path)}:{key}"
    return str(spec or "")


def setup(*, renderer: str | None = "plotly_mimetype") -> None:
    """Prepare a notebook: forget earlier gates (re-running all cells starts fresh) and make plotly
    emit its own mimetype only, which JupyterLab renders with the bundled extension and
    ``workbench run`` turns into HTML with one shared local plotly.js (no 5 MB per figure)."""
    reset_gates()
    if renderer:
        import plotly.io as pio

        pio.renderers.default = renderer


def show(fig) -> None:
    """Display a plotly figure at top level (an alias that keeps notebooks short)."""
    from IPython.display import display

    display(fig)


def explore(figure, *, interactive: bool = True, max_offline: int = 48, **controls):
    """An explorer: one control per keyword, redrawing ``figure(**values)`` on every change.

    ``controls`` are what :func:`ipywidgets.interactive` accepts: a list of choices (dropdown),
    ``(min, max)`` or ``(min, max, step)`` (slider), a bool (checkbox).

    ``interactive=True``: an ipywidgets UI (the figure in an Output widget, so JupyterLab renders
    plotly's mimetype there too). ``interactive=False`` (a headless run, the shared HTML report):
    one plotly figure holding the figure of every combination of the controls' values, and
    plotly's own dropdown to switch between them (each switch restores that figure's traces,
    titles, axes, shapes and annotations), so the explorer works in the offline HTML with no
    kernel and no widget state. A slider is sampled evenly; when there are more than
    ``max_offline`` combinations each control's values are thinned evenly (ends kept) and the
    title says how many are shown. Returns None (it displays; :func:`offline_explorer` returns the
    figure).

    Example
    -------
    >>> nb.explore(lambda metric: divergence_curves_figure(ds.div.curves(metric=metric)),
    ...            metric=["rel_l2", "max_abs"], interactive=interactive)     # doctest: +SKIP
    """
    from IPython.display import display

    if interactive:
        import ipywidgets as W

        ui = W.interactive(figure, {"auto_display": True}, **controls)
        ui.add_class("workbench-explorer")
        display(ui)
        return None  # displayed once: a returned object would be shown again as the cell's value
    display(offline_explorer(figure, max_offline=max_offline, **controls))
    return None


def _choices(spec) -> list:
    """The values a control takes offline: a list as is, a bool both ways, a slider sampled."""
    if isinstance(spec, bool):
        return [False, True]
    if isinstance(spec, tuple) and len(spec) in (2, 3) and all(isinstance(v, (int, float)) for v in spec):
        lo, hi = spec[0], spec[1]
        step = spec[2] if len(spec) == 3 else (1 if all(isinstance(v, int) for v in spec) else (hi - lo) / 20)
        n = int(round((hi - lo) / step)) + 1
        vals = [lo + i * step for i in range(n)]
        if all(isinstance(v, int) for v in spec):
            vals = [int(v) for v in vals]
        else:
            vals = [round(v, 12) for v in vals]
        return _thin(vals, 21)
    if isinstance(spec, dict):
        return list(spec.values())
    return list(spec)


def _thin(vals: list, n: int) -> list:
    """At most ``n`` values of ``vals``, evenly spaced, both ends kept."""
    if len(vals) <= n:
        return list(vals)
    if n <= 1:
        return [vals[0]]
    idx = sorted({round(i * (len(vals) - 1) / (n - 1)) for i in range(n)})
    return [vals[i] for i in idx]


def offline_explorer(figure, *, max_offline: int = 48, **controls):
    """The plotly figure of :func:`explore` ``(interactive=False)``: every combination's traces,
    one visible set at a time, switched by plotly's dropdown (no kernel, no network)."""
    import itertools

    import plotly.graph_objects as go

    names = list(controls)
    values = [_choices(controls[k]) for k in names]
    total = math.prod(len(v) for v in values) if values else 1
    while math.prod(len(v) for v in values) > max_offline:  # thin the longest control first
        i = max(range(len(values)), key=lambda j: len(values[j]))
        values[i] = _thin(values[i], max(1, len(values[i]) - 1))
    combos = list(itertools.product(*values))
    figs = [figure(**dict(zip(names, c))) for c in combos]
    out = go.Figure()
    spans, layouts = [], []
    for f in figs:
        start = len(out.data)
        out.add_traces(list(f.data))
        spans.append((start, len(out.data)))
        layouts.append(f.layout)
    shown = f" ({len(combos)} of {total} combinations)" if len(combos) < total else ""
    buttons = []
    for i, (c, (a, b)) in enumerate(zip(combos, spans)):
        vis = [a <= j < b for j in range(len(out.data))]
        lay = layouts[i]
        title = (lay.title.text or "") if lay.title else ""
        patch = {"title.text": title + shown, "shapes": [s.to_plotly_json() for s in lay.shapes or []],
                 "annotations": [x.to_plotly_json() for x in lay.annotations or []]}
        for ax in ("xaxis", "yaxis"):
            a_lay = getattr(lay, ax)
            patch[f"{ax}.title.text"] = a_lay.title.text if a_lay.title else None
            patch[f"{ax}.type"] = a_lay.type or "-"
            patch[f"{ax}.autorange"] = True
        label = ", ".join(f"{k}={v}" for k, v in zip(names, c))
        buttons.append({"label": label, "method": "update", "args": [{"visible": vis}, patch]})
    out.update_layout(figs[0].layout)
    for j, t in enumerate(out.data):
        t.visible = spans[0][0] <= j < spans[0][1]
    out.update_layout(buttons[0]["args"][1])
    # the dropdown sits between the title and the plot, clear of subplot titles (about 30 px over
    # the plot area): its place in paper units follows from the plot area's height in pixels
    m = out.layout.margin
    top, bottom = 130, (m.b if m.b is not None else 80)
    plot_h = max(100, (out.layout.height or 450) - top - bottom)
    out.update_layout(updatemenus=[{"buttons": buttons, "direction": "down", "showactive": True, "x": 0, "xanchor": "left",
                                    "y": 1 + 34 / plot_h, "yanchor": "bottom", "pad": {"r": 4, "t": 0}}],
                      margin={"t": top})
    out.layout.meta = {"workbench_explorer": names, "combinations": len(combos), "of": total}
    return out


# -- gates -----------------------------------------------------------------------------------------

def gate(name: str, value: Any, threshold: Any, *, op: str = "<=", help: str = "",
         display: bool = True, kind: str = "regression") -> None:
    """Record the check ``value <op> threshold`` under ``name`` and display it.

    Parameters
    ----------
    name: a short identifier (``aa_noise_rel_l2``); recording the same name again replaces it
    value, threshold: numbers (or anything comparable with ``op``)
    op: one of ``<=``, ``<``, ``>=``, ``>``, ``==``, ``!=``
    help: what the gate protects, shown next to it
    display: show the gate as a cell output (the runner reads it from there)
    kind: "regression" (a check with no planted answer) or "expectation" (see :func:`expect`)

    A failing gate does not raise here, :func:`assert_gates` does; :func:`gates` lists them.
    """
    if op not in _OPS:
        raise WorkbenchError(f"gate {name!r}: unknown op {op!r}", key="op",
                             fix=f"use one of {list(_OPS)}")
    if not isinstance(name, str) or not name:
        raise WorkbenchError(f"a gate name must be a non-empty string, got {name!r}", key="name",
                             fix="name the check, e.g. gate('aa_noise_rel_l2', ...)")
    try:
        passed = bool(_OPS[op](value, threshold))
    except TypeError as e:
        raise WorkbenchError(f"gate {name!r}: cannot compare {value!r} {op} {threshold!r}: {e}",
                             key=name, fix="pass comparable values (numbers)") from None
    if isinstance(value, float) and math.isnan(value):
        passed = False
    if kind not in ("regression", "expectation"):
        raise WorkbenchError(f"gate {name!r}: kind must be 'regression' or 'expectation', got {kind!r}", key="kind",
                             fix="pass kind='regression' or kind='expectation'")
    g = Gate(name=name, value=_jsonable(value), threshold=_jsonable(threshold), op=op,
             passed=passed, help=help, kind=kind)
    _GATES[name] = g
    if display:
        _display_gate(g)


def _display_gate(g: Gate) -> None:
    from IPython.display import display

    color = "#1a7f37" if g.passed else "#cf222e"
    badge = "PASS" if g.passed else "FAIL"
    body = html.escape(f"{_fmt(g.value)} {g.op} {_fmt(g.threshold)}")
    helptext = f" <span style='color:#57606a'>({html.escape(g.help)})</span>" if g.help else ""
    html_out = (f"<div class='workbench-gate' data-gate='{html.escape(g.name)}' "
                f"data-passed='{str(g.passed).lower()}' style='font-family:monospace'>"
                f"<b style='color:{color}'>{badge}</b> gate <b>{html.escape(g.name)}</b>: "
                f"{body}{helptext}</div>")
    display({GATE_MIMETYPE: g.to_dict(), "text/html": html_out, "text/plain": g.line()}, raw=True)


def expect(name: str, value: Any, expected: Any, *, help: str = "", display: bool = True) -> None:
    """An expectation gate ``value == expected``, recorded only when ``expected`` is given.

    With ``expected`` None the finding stands on its own: nothing is gated (a user's capture with
    no expectation runs to the end and reports). Like :func:`gate` it returns nothing (a cell
    ending with it shows the gate, not a bare ``True``); the verdict is in :func:`gates`.
    """
    if expected is None:
        if display:
            from IPython.display import display as show
            show({"text/plain": f"expectation {name}: none given; found {_fmt(value)}"}, raw=True)
        return
    gate(name, value, expected, op="==", help=help, display=display, kind="expectation")


def expectations(text: str, fields: dict[str, type], *, metadata: dict | None = None) -> dict[str, Any]:
    """Parse an expectation parameter ``"step=0 tied=67,692 pick=67"`` into typed values.

    ``fields`` maps each allowed field to its type (``int``, ``float``, ``str`` or ``list``: a
    comma-separated list of ints). ``"metadata"`` returns ``metadata`` (a bundled capture's
    expectations, used only as gate inputs), ``""`` returns ``{}`` (no expectation: nothing is
    gated). A field not in ``fields`` or a value of the wrong type is a WorkbenchError naming it.
    """
    t = str(text or "").strip()
    if t == "metadata":
        return {k: v for k, v in (metadata or {}).items() if k in fields and v is not None}
    out: dict[str, Any] = {}
    for part in t.split():
        k, sep, v = part.partition("=")
        if not sep or k not in fields:
            raise WorkbenchError(f"expectation {part!r} is not field=value with a field of {sorted(fields)}",
                                 key="expect", fix=f"write e.g. '{' '.join(f'{f}=...' for f in fields)}', or ''")
        try:
            out[k] = [int(x) for x in v.split(",") if x] if fields[k] is list else fields[k](v)
        except ValueError:
            raise WorkbenchError(f"expectation {k}={v!r} is not a {fields[k].__name__}", key="expect",
                                 fix=f"write {k}=<{fields[k].__name__}>") from None
    return out


_FINDINGS: list[dict] = []


def finding(text: str, *, display: bool = True, **data: Any) -> None:
    """State what the notebook found, in words (and optional machine-readable ``data``).

    Shown as a cell output with a machine-readable record (:data:`FINDING_MIMETYPE`) that
    ``workbench run`` writes to results.json and shows in index.html.

    Example
    -------
    >>> nb.finding("first divergence: rank 0, step 0, layer 2, mlp.down_proj/output, rel_l2 2.8e-3 "
    ...            "= 40x its A/A noise", layer=2)                                       # doctest: +SKIP
    """
    if not isinstance(text, str) or not text.strip():
        raise WorkbenchError(f"a finding is a non-empty sentence, got {text!r}", key="text",
                             fix="say what the data showed, e.g. finding('tokens identical for 64/64 steps')")
    rec = {"text": text.strip(), "data": {k: _jsonable(v) for k, v in data.items()}}
    _FINDINGS.append(rec)
    if display:
        from IPython.display import display as show
        show({FINDING_MIMETYPE: rec, "text/plain": f"finding: {rec['text']}",
              "text/html": f"<div class='workbench-finding' style='font-weight:600'>finding: "
                           f"{html.escape(rec['text'])}</div>"}, raw=True)


def skipped(what: str, reason: str, *, display: bool = True) -> None:
    """Say that part of the notebook did not run here and why (a backend without its GPU, a
    compiler that is missing): a finding ``skipped <what>: <reason>`` with data ``skipped`` and
    ``reason``, so the report lists what was not checked instead of passing it over in silence.

    Example
    -------
    >>> nb.skipped("gemm backend numba", "numba.cuda finds no CUDA GPU")               # doctest: +SKIP
    """
    finding(f"skipped {what}: {reason}", display=display, skipped=what, reason=reason)


def device(spec: str = "auto"):
    """The torch device of a notebook's ``device`` parameter ("auto": the GPU when there is one,
    else the CPU; :func:`workbench.kernels.registry.resolve_device`), printed with its name."""
    from workbench.kernels.registry import resolve_device
    dev = resolve_device(spec)
    if dev.type == "cuda":
        import torch
        print(f"kernels run on {dev} ({torch.cuda.get_device_name(dev)})")
    else:
        print(f"kernels run on {dev}")
    return dev


def backends_on(family: str, names, dev) -> list[str]:
    """The backends of ``names`` that can run on ``dev``; each one that cannot is reported with
    :func:`skipped` (its reason). A name that is no backend of ``family`` is an error."""
    from workbench.kernels.registry import runnable
    ok, why = runnable(family, names, dev)
    for name, reason in why.items():
        skipped(f"{family} backend {name} on {dev}", reason)
    return ok


def findings() -> list[dict]:
    """Findings stated so far in this kernel, in order."""
    return list(_FINDINGS)


def gates() -> list[Gate]:
    """Gates recorded so far in this kernel, in recording order."""
    return list(_GATES.values())


def reset_gates() -> None:
    """Forget recorded gates and findings (``setup()`` does this)."""
    _GATES.clear()
    _FINDINGS.clear()


def assert_gates(*, require: int = 1) -> None:
    """Raise :class:`GateError` naming every failed gate; call it in a notebook's last cell.

    ``require``: the least number of gates that must have been recorded (a notebook whose gates
    were skipped by mistake fails instead of passing silently).
    """
    gs = gates()
    if len(gs) < require:
        raise GateError(f"only {len(gs)} gate(s) recorded, expected at least {require}",
                        fix="record checks with workbench.notebook.gate(...) before assert_gates()")
    failed = [g for g in gs if not g.passed]
    if failed:
        names = ", ".join(g.name for g in failed)
        detail = "; ".join(f"{g.name}: {_fmt(g.value)} {g.op} {_fmt(g.threshold)} is false" for g in failed)
        raise GateError(f"{len(failed)} of {len(gs)} gate(s) failed: {names} ({detail})", key=names,
                        fix="look at the figures above; change the threshold parameter only if the "
                            "new behaviour is intended")
    print(f"all {len(gs)} gate(s) passed: " + ", ".join(g.name for g in gs))
