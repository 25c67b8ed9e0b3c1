import numpy as np
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


def _div_captures(tmp_path):
    from workbench.capture import CaptureWriter
    x = torch.linspace(-1, 1, 16)
    for arm, fault in (("control", 0.0), ("candidate", 1e-2)):
        with CaptureWriter(tmp_path / arm, arm=arm) as w:
            for step in range(2):
                for layer in range(3):
                    for op in ("attn", "mlp"):
                        y = x * (layer + 1) + step
                        if op == "mlp" and layer >= 1:
                            y = y + fault  # layer 0 stays bit-identical in every op
                        w.add(y, step=step, layer=layer, op=op, name="output")
    from workbench.analysis import compare_captures
    return compare_captures(tmp_path / "control", tmp_path / "candidate").to_xarray()


def test_divergence_figures_draw_the_accessor_datasets(tmp_path):
    from workbench.errors import WorkbenchError
    from workbench.plots import divergence_curves_figure, divergence_heatmap_figure

    ds = _div_captures(tmp_path)
    curves = ds.div.curves()
    fig = divergence_curves_figure(curves)
    lines = {t.name: t for t in fig.data}
    assert set(lines) == {"attn/output", "mlp/output"}
    mlp = lines["mlp/output"]
    err = curves.error.sel(op="mlp").values
    assert list(mlp.x) == [0, 1, 2] and mlp.y[1] == err[1] and mlp.y[2] == err[2]
    assert mlp.customdata[0] == "0 (bit-identical)" and 0 < mlp.y[0] < err[1:].min()  # drawn below, said on hover
    assert list(mlp.marker.symbol) == ["circle", "x", "x"]  # crosses where a key is beyond its threshold
    assert any(s.line.dash == "dash" for s in fig.layout.shapes)  # the first divergence (layer 1)
    hm = divergence_heatmap_figure(ds.div.heatmap(op="mlp"))
    z = hm.data[0].z
    assert z.shape == (3, 2) and all(map(lambda v: v != v, z[0]))  # log10 of 0: blank
    assert z[1, 0] == pytest.approx(float(np.log10(ds.div.heatmap(op="mlp").error.sel(layer=1, step=0))))
    with pytest.raises(WorkbenchError, match="div.curves"):
        divergence_curves_figure(ds)  # the key Dataset is not a curve: the error names the call
