"""ipywidgets explorers: UI only; every number comes from ``workbench.analysis``."""

from workbench.widgets.explorer import CaptureExplorer
from workbench.widgets.graft_panel import GraftPanel
from workbench.widgets.replay_panel import ReplayPanel

__all__ = ["CaptureExplorer", "GraftPanel", "ReplayPanel"]
