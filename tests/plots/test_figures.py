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
    # the zoom panel spans a few bf16 ULPs (0.0625 at 11) around the tie, its grid drawn
    lo, hi = fig.layout.yaxis2.range
    assert hi - lo < 0.5 and lo < 11.125 < hi
    grid = sorted(sh.y0 for sh in fig.layout.shapes if sh.yref == "y2")
    assert 11.125 in grid and np.allclose(np.diff(grid), 0.0625)
    zoomed = [t for t in fig.data if t.xaxis == "x2" and t.showlegend is False and t.mode == "markers"]
    assert all(sorted(t.x) == ["67", "692"] for t in zoomed)  # only the tokens near the top


def test_greedy_parity_figure_stops_where_the_runs_fork():
    a = torch.tensor([[1.0, 2.0, 0.0], [3.0, 1.0, 0.5], [1.0, 1.0, 0.0], [0.0, 5.0, 1.0]])
    b = torch.tensor([[1.0, 2.0, 0.0], [1.0, 3.0, 0.5], [9.0, 1.0, 0.0], [0.0, 1.0, 7.0]])
    fig = greedy_parity_figure(greedy_parity(a, b))
    assert "2/4 steps agree" in fig.layout.title.text
    margins = [t for t in fig.data if t.name and t.name.endswith("top-2 margin")]
    assert len(margins) == 2 and all(list(t.x) == [0, 1] for t in margins)  # nothing after the fork at step 1
    fork = [sh for sh in fig.layout.shapes if sh.line.dash == "dash"]
    assert len(fork) == 1 and fork[0].x0 == 1
    assert any("fork" in (an.text or "") and "2 step(s)" in an.text for an in fig.layout.annotations)
    assert fig.layout.yaxis.type == "log"


def test_splitk_grid_figure_has_one_panel_per_order():
    g = torch.Generator().manual_seed(0)
    ds = splitk_sweep(torch.randn(1, 64, generator=g), torch.randn(8, 64, generator=g), splits=[1, 2, 4],
                      partial_dtypes=["fp32", "bf16"], orders=["sequential", "tree"])
    for var in ("fails", "rel_l2", "partial_cause", "max_ulp"):
        fig = splitk_grid_figure(ds, var=var)
        heat = [t for t in fig.data if t.type == "heatmap" and t.showscale is not False or t.hoverinfo != "skip"]
        assert fig.data[0].z.shape == (2, 3)
        if var in ("rel_l2", "max_ulp"):  # errors span decades: log colours, the values on the colorbar
            raw = ds[var].sel(order="sequential").transpose("partial_dtype", "splits").values
            pos = raw > 0
            assert np.allclose(np.asarray(fig.data[0].z, float)[pos], np.log10(raw[pos]))
            assert all(t.startswith("1e") or t[0].isdigit() for t in fig.data[0].colorbar.ticktext)
            zero_cells = (raw == 0).any() or (ds[var].sel(order="tree").values == 0).any()
            assert any(t.name and t.name.startswith("0 (exact") for t in fig.data) == bool(zero_cells)
        else:
            assert len(heat) == 2


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
    lines = {t.name: t for t in fig.data if t.yaxis in (None, "y") and t.x[0] is not None}
    assert set(lines) == {"attn/output", "mlp/output"}
    mlp = lines["mlp/output"]
    err = curves.error.sel(op="mlp").values
    assert list(mlp.x) == [0, 1, 2] and mlp.y[1] == err[1] and mlp.y[2] == err[2]
    # layer 0 is bit-identical: not drawn in the data range but in the strip under it, legended
    assert mlp.y[0] is None
    strip = [t for t in fig.data if t.yaxis == "y9" and t.legendgroup == "mlp/output"]
    assert len(strip) == 1 and list(strip[0].x) == [0] and list(strip[0].y) == ["bit-identical"]
    assert strip[0].marker.color == mlp.line.color
    assert fig.layout.yaxis9.domain[1] < fig.layout.yaxis.domain[0]  # the strip lies outside the plot
    names = [t.name for t in fig.data]
    assert "bit-identical (error 0: strip below)" in names and "a key beyond its threshold" in names
    assert list(mlp.marker.symbol) == ["circle", "x", "x"]  # crosses where a key is beyond its threshold
    assert any(s.line.dash == "dash" for s in fig.layout.shapes)  # the first divergence (layer 1)
    assert fig.layout.yaxis.title.text.startswith("relative L2 error")  # in words, not rel_l2
    hm = divergence_heatmap_figure(ds.div.heatmap(op="mlp"))
    z = hm.data[0].z
    assert z.shape == (3, 2) and all(map(lambda v: v != v, z[0]))  # log10 of 0: not a colour of the scale
    assert list(hm.data[1].z[0]) == [1.0, 1.0] and hm.data[1].colorscale[0][1] == "#c8c8c8"  # grey, and legended:
    assert "bit-identical (error 0)" in [t.name for t in hm.data]
    assert z[1, 0] == pytest.approx(float(np.log10(ds.div.heatmap(op="mlp").error.sel(layer=1, step=0))))
    with pytest.raises(WorkbenchError, match="div.curves"):
        divergence_curves_figure(ds)  # the key Dataset is not a curve: the error names the call


def test_heatmap_cells_reduce_over_the_same_keys(tmp_path):
    # step 1 records an extra op at layer 1 (a detail step) with a larger error: with common keys
    # the cell does not stand out for it; without, it does
    from workbench.analysis import compare_captures
    from workbench.capture import CaptureWriter
    from workbench.plots import divergence_heatmap_figure

    x = torch.linspace(-1, 1, 16)
    for arm, f in (("control", 0.0), ("candidate", 1.0)):
        with CaptureWriter(tmp_path / arm, arm=arm) as w:
            for step in range(3):
                for layer in range(2):
                    w.add(x + layer + f * 1e-3 * (layer + 1), step=step, layer=layer, op="mlp", name="output")
                    if step == 1:
                        w.add(x + f * 1e-1, step=step, layer=layer, op="extra", name="output")
    ds = compare_captures(tmp_path / "control", tmp_path / "candidate").to_xarray()
    common, every = ds.div.heatmap(), ds.div.heatmap(common=False)
    assert common.attrs["n_left_out"] == 2 and int(common.n_keys.max()) == 1
    row = common.error.sel(layer=1).values
    assert np.allclose(row, row[0])  # no stripe at the detail step
    assert every.error.sel(layer=1, step=1) > 10 * every.error.sel(layer=1, step=0)
    fig = divergence_heatmap_figure(common)
    assert "2 key(s) recorded only at some steps left out" in fig.layout.title.text


def test_replay_figure_marks_skipped_variants_instead_of_clamping():
    import xarray as xr

    from workbench.plots import replay_figure

    err = np.array([[1e-7, np.nan], [2e-7, np.nan], [0.0, np.nan]])
    ds = xr.Dataset({"err_oracle": (("case", "variant"), err),
                     "n_closer": ("variant", [2, 0]), "captured_err_oracle": ("case", [1e-4, 1e-4, 1e-4])},
                    coords={"variant": ["torch:base", "ext:bf16"], "rank": ("case", [0, 0, 1]),
                            "step": ("case", [0, 1, 0]), "layer": ("case", [3, 3, 3])})
    fig = replay_figure(ds)
    main = [t for t in fig.data if t.yaxis in (None, "y")]
    drawn = [y for t in main if t.name != "captured output" for y in t.y if y is not None]
    assert min(drawn) == 1e-7  # nothing clamped to a floor
    assert not any(t.name.startswith("ext:bf16 (") for t in main)  # a skipped variant has no points
    skipped = [t for t in fig.data if t.yaxis == "y9" and list(t.y) == ["skipped"] * 3]
    assert len(skipped) == 1 and skipped[0].name == "ext:bf16: skipped (not run)"
    zero = [t for t in fig.data if t.yaxis == "y9" and list(t.y) == ["bit-identical"]]
    assert len(zero) == 1 and list(zero[0].x) == ["r1 s0 L3"]
    assert fig.layout.yaxis.title.text == "relative L2 error against FP64"
