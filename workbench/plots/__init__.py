"""Plotly figure builders: each takes the xarray Dataset an analysis returned (no math here)."""

from workbench.plots.logits import greedy_parity_figure, logit_rounding_figure
from workbench.plots.sampling import sampling_flips_figure
from workbench.plots.splitk import splitk_grid_figure
from workbench.plots.stats import interval_figure

__all__ = ["greedy_parity_figure", "logit_rounding_figure", "sampling_flips_figure", "splitk_grid_figure",
           "interval_figure"]
from workbench.plots.divergence import divergence_curves_figure, divergence_heatmap_figure, graft_figure
from workbench.plots.relocation import relocation_figure, relocation_growth_figure
from workbench.plots.replay import counterfactuals_figure, replay_figure
from workbench.plots.sharding import sharding_figure
from workbench.plots.state import state_drift_figure, state_heads_figure

__all__ += ["divergence_curves_figure", "divergence_heatmap_figure", "graft_figure", "relocation_figure", "relocation_growth_figure",
            "counterfactuals_figure", "replay_figure", "sharding_figure", "state_drift_figure", "state_heads_figure"]
from workbench.plots.trajectory import trajectory_figure

__all__ += ["trajectory_figure"]
from workbench.plots.regret import regret_figure

__all__ += ["regret_figure"]
