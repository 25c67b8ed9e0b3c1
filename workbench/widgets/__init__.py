"""ipywidgets explorers: UI only; every number comes from ``workbench.analysis``."""

from workbench.widgets.explorer import CaptureExplorer
from workbench.widgets.replay_panel import ReplayPanel

__all__ = ["CaptureExplorer", "ReplayPanel"]
