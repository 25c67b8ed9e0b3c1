"""Plotly figure builders: each takes the xarray Dataset an analysis returned (no math here)."""

from workbench.plots.logits import greedy_parity_figure, logit_rounding_figure
from workbench.plots.sampling import sampling_flips_figure
from workbench.plots.splitk import splitk_grid_figure
from workbench.plots.stats import interval_figure

__all__ = ["greedy_parity_figure", "logit_rounding_figure", "sampling_flips_figure", "splitk_grid_figure",
           "interval_figure"]
