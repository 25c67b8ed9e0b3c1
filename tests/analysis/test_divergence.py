from pathlib import Path

import pytest
import torch

from workbench.analysis import compare_captures, graft
from workbench.models.hybrid import HybridRerun
from workbench.capture import CaptureWriter, open_capture
from workbench.errors import AnalysisError

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
EXACT = {"threshold": 0.0}


def _write(path, fault_layer=None, noise=0.0, seed=0):
    """3 layers x 3 steps: x -> layer l: input, output = 2 * input (+ an error at fault_layer)."""
    g = torch.Generator().manual_seed(seed)
    w = CaptureWriter(path, arm=path.name)
    x0 = torch.randn(8, generator=torch.Generator().manual_seed(1))
    for s in range(3):
        x = x0 + s
        for l in range(3):
            w.add(x, step=s, layer=l, op="mix", name="input")
            y = 0.5 * x + noise * torch.randn(8, generator=g)
            if l == fault_layer:
                y = y + 1e-2 * (s + 1)
            w.add(y, step=s, layer=l, op="mix", name="output")
            x = y
    w.close()
    return open_capture(path)


@pytest.fixture(scope="module")
def arms(tmp_path_factory):
    d = tmp_path_factory.mktemp("div")
    return _write(d / "control"), _write(d / "repeat", noise=1e-7, seed=1), _write(d / "candidate", fault_layer=1)


def test_curves_and_first(arms):
    ctl, rep, cand = arms
    fd = compare_captures(ctl, cand, aa=rep).to_xarray()
    ds = fd.div.curves()
    assert ds.error.dims == ("op", "layer")
    assert float(ds.error.sel(op="mix", layer=0)) < float(ds.threshold.sel(op="mix", layer=0))
    assert bool(ds.exceeded.sel(op="mix", layer=1))
    assert (fd.attrs["first_layer"], fd.attrs["first_name"], fd.attrs["first_step"]) == (1, "output", 0)
    assert fd.div.first()["layer"] == 1
    assert fd.div.curves(op="mix").sizes["layer"] == 3
    assert ds.attrs["first_layer"] == 1 and ds.attrs["metric"] == "rel_l2"  # curves keep the comparison's attrs
    assert float(ds.aa_band_layer.sel(layer=1)) == float(ds.aa.sel(layer=1).max()) > 0  # the figure's noise band
    hm = fd.div.heatmap()
    assert hm.error.dims == ("layer", "step") and hm.error.shape == (3, 3)
    with pytest.raises(AnalysisError, match="metric"):
        fd.div.curves(metric="nope")
    with pytest.raises(AnalysisError, match="no compared keys"):
        fd.div.curves(op="qsa")


def test_curves_reduce_exactly_what_the_table_holds(arms):
    """The reductions against the table they come from: max and mean over steps, the layer
    argument, any key beyond its threshold, key counts; keys around the first divergence."""
    ctl, rep, cand = arms
    res = compare_captures(ctl, cand, aa=rep)
    t = res.table[res.table["name"] == "output"]
    ds = res.to_xarray()
    for reduce in ("max", "mean"):
        c = ds.div.curves(metric="max_abs", by="layer", reduce=reduce)
        want = t.groupby("layer")["max_abs"].agg(reduce)
        assert c.error.to_series().to_dict() == pytest.approx(want.to_dict(), rel=0, abs=0)
        assert c.n_keys.to_series().tolist() == [3, 3, 3]
    by_step = ds.div.curves(by=("layer", "step"), name=None, layer=1)
    assert by_step.exceeded.sel(layer=1).values.tolist() == [True, True, True]
    assert by_step.n_keys.sel(layer=1).values.tolist() == [2, 2, 2]  # input and output
    near = ds.div.around(before=2, after=1)
    pos = int(res.table.index.get_loc(res.first_divergence().name))
    assert near.seq.values.tolist() == res.table["seq"].iloc[pos - 2: pos + 2].tolist()


def test_graft_with_generic_rerun(arms, tmp_path):
    ctl, _, _ = arms
    runs = []

    def rerun(overrides):  # the candidate model: layer 1 adds an error; overrides replace tensors
        path = tmp_path / f"run{len(runs)}"
        runs.append(path)
        w = CaptureWriter(path, arm="candidate")
        x0 = torch.randn(8, generator=torch.Generator().manual_seed(1))
        for s in range(3):
            x = x0 + s
            for l in range(3):
                x = overrides.get((0, s, l, "mix", "input"), x)
                w.add(x, step=s, layer=l, op="mix", name="input")
                y = 0.5 * x + (1e-2 * (s + 1) if l == 1 else 0)
                y = overrides.get((0, s, l, "mix", "output"), y)
                w.add(y, step=s, layer=l, op="mix", name="output")
                x = y
        w.close()
        return open_capture(path)

    ds = graft(rerun, ctl, replace="input", rules=EXACT)
    assert ds.attrs["at_layer"] == 1 and not ds.attrs["op_agrees"]
    assert "starts in this op" in ds.attrs["verdict"]
    ds = graft(rerun, ctl, at=dict(rank=0, step=0, layer=2, op="mix"), replace="input", rules=EXACT)
    assert ds.attrs["op_agrees"]  # layer 2 is fine: it only passed the error on
    ds = graft(rerun, ctl, at=dict(rank=0, step=2, layer=1, op="mix"), replace="output", rules=EXACT)
    assert bool(ds.exceeded.sel(variant="candidate").any())
    assert ds.attrs["downstream_agrees"]


def test_graft_hybrid_model():
    from workbench.models.hybrid import ArmConfig, HybridConfig, HybridDecoder
    from workbench.numerics.policy import Policy
    m = HybridDecoder(HybridConfig(n_layers=4, vocab=64))
    p = m.prompt(16)
    ctl = HybridRerun(m, ArmConfig(name="control"), p, steps=0)({})
    bad = ArmConfig(name="cand", gdn=Policy(state_dtype="bf16"))  # the fault is upstream of layer 3 QSA
    rr = HybridRerun(m, bad, p, steps=0)
    ds = graft(rr, ctl, at=dict(rank=0, step=0, layer=3, op="qsa"), replace="input", rules=EXACT)
    assert ds.attrs["op_agrees"], ds.attrs["verdict"]
    assert "upstream" in ds.attrs["verdict"]
    with pytest.raises(AnalysisError, match="cannot graft"):
        rr({(0, 0, 3, "qsa", "q"): torch.zeros(1)})


def test_bundled_planted_first_divergence():
    cand = open_capture(CAPTURES / "candidate")
    want = cand.run["expect"]["first_divergence"]
    ds = compare_captures(CAPTURES / "control", cand, aa=CAPTURES / "control-repeat", step=want["step"]).to_xarray()
    got = {f: ds.attrs[f"first_{f}"] for f in ("rank", "step", "layer", "op", "name")}
    assert got == want
    assert ds.div.first()["layer"] == want["layer"]
