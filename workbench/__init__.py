"""workbench: find where, why and whether two runs of an LLM serving stack part ways.

The top-level names are imported lazily so that ``import workbench`` stays fast.
"""

from __future__ import annotations

import importlib

from workbench.errors import WorkbenchError

__version__ = "0.1.0"

_LAZY = {
    "CaptureWriter": "workbench.capture.writer",
    "Capture": "workbench.capture.reader",
    "open_capture": "workbench.capture.reader",
    "import_capture": "workbench.capture.importers",
    "record": "workbench.capture.recorder",
    "compare": "workbench.numerics.metrics",
    "Comparison": "workbench.numerics.metrics",
    "compare_captures": "workbench.analysis.compare",
    "Rule": "workbench.analysis.compare",
    "Policy": "workbench.numerics.policy",
    "use_policy": "workbench.numerics.policy",
}

__all__ = ["WorkbenchError", "__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
