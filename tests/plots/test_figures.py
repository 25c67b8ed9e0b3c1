import plotly.graph_objects as go
import pytest
import torch

from workbench.analysis import (
    aa_comparison, greedy_parity, logit_rounding, paired_binary_table, paired_timing, sampling_flips, splitk_sweep,
)
from workbench.plots import (
    greedy_parity_figure, interval_figure, logit_rounding_figure, sampling_flips_figure, splitk_grid_figure,
)


def test_logit_rounding_figure_marks_the_tie_and_choice():
    v = torch.linspace(-4, 3, 1000, dtype=torch.float64)
    v[67], v[692] = 11.11763134, 11.14099662
    fig = logit_rounding_figure(logit_rounding(v))
    assert isinstance(fig, go.Figure)
    assert "chosen 67 (FP64 692), 2 tied" in fig.layout.title.text
    tied = [t for t in fig.data if t.name == "tied in bf16"][0]
    assert sorted(tied.x) == ["67", "692"]


def test_greedy_parity_figure_marks_mismatches():
    a = torch.tensor([[1.0, 2.0, 0.0], [3.0, 1.0, 0.5]])
    b = torch.tensor([[1.0, 2.0, 0.0], [1.0, 3.0, 0.5]])
    fig = greedy_parity_figure(greedy_parity(a, b))
    differ = [t for t in fig.data if t.name == "tokens differ"][0]
    assert list(differ.x) == [1] and "1/2 steps agree" in fig.layout.title.text


def test_splitk_grid_figure_has_one_panel_per_order():
    g = torch.Generator().manual_seed(0)
    ds = splitk_sweep(torch.randn(1, 64, generator=g), torch.randn(8, 64, generator=g), splits=[1, 2, 4],
                      partial_dtypes=["fp32", "bf16"], orders=["sequential", "tree"])
    for var in ("fails", "rel_l2", "partial_cause"):
        fig = splitk_grid_figure(ds, var=var)
        assert len(fig.data) == 2 and fig.data[0].z.shape == (2, 3)


def test_sampling_flips_figure_shows_intervals_and_draws():
    ds = sampling_flips([0.760651, 0.239349], [0.839734, 0.160266], u=[0.5, 0.8])
    fig = sampling_flips_figure(ds)
    assert fig.data[0].base[0] == pytest.approx(0.760651) and fig.data[0].text[0] == "1->0"
    assert "0.079083" in fig.layout.title.text and len(fig.data) == 2


@pytest.mark.parametrize("kind", ["binary", "timing", "aa"])
def test_interval_figure(kind):
    if kind == "binary":
        ds = paired_binary_table(45, 7, 4, 8)
    elif kind == "timing":
        ds = paired_timing([1.0, 1.02, 0.99], [1.1, 1.12, 1.09])
    else:
        ds = aa_comparison(paired_timing([1.0, 1.01, 0.99], [1.0, 1.0, 1.01]),
                           paired_timing([1.0, 1.01, 0.99], [1.2, 1.21, 1.2]))
    fig = interval_figure(ds)
    assert isinstance(fig, go.Figure) and len(fig.data) == 1
    assert ds.attrs["ci_method"] in fig.layout.title.text
