from pathlib import Path

import pytest
import torch

from workbench.analysis import counterfactuals, replay
from workbench.capture import CaptureWriter, open_capture
from workbench.errors import AnalysisError
from workbench.kernels import gdn
from workbench.numerics.policy import Policy

CAPTURES = Path(__file__).resolve().parents[2] / "captures"


@pytest.fixture(scope="module")
def cap(tmp_path_factory):
    """GDN decode steps recorded as the bundled model does, with a bf16-state 'control'."""
    path = tmp_path_factory.mktemp("rp") / "c"
    w = CaptureWriter(path, arm="c")
    g = torch.Generator().manual_seed(0)
    S = None
    pol = Policy(state_dtype="bf16")
    for step in range(6):
        q, k, v = (torch.randn(1, 1, 2, 8, generator=g) for _ in range(3))
        gg, beta = -0.05 * torch.rand(1, 1, 2, generator=g), torch.rand(1, 1, 2, generator=g)
        o, S = gdn.recurrent(q, k, v, gg, beta, initial_state=S, qk_l2norm=True, policy=pol)
        for n, t in (("q", q), ("k", k), ("v", v), ("g", gg), ("beta", beta), ("core", o)):
            w.add(t[0], step=step, layer=0, op="gdn", name=n)
        w.add(S[0], step=step, layer=0, op="gdn", name="state")
    w.close()
    return open_capture(path)


def test_replay_counts_closer(cap):
    ds = replay(cap, op="gdn", output="state", policies=[Policy(), Policy(state_dtype="bf16")])
    assert ds.sizes["case"] == 6
    assert int(ds.n_closer.sel(variant="default")) == 6          # fp32 state beats the bf16 capture
    assert float(ds.err_captured.sel(variant="state_dtype=bf16").max()) == 0.0
    with pytest.raises(AnalysisError, match="adapter"):
        replay(cap, op="nope")


def test_counterfactual_attributes_the_knob(cap):
    ds = counterfactuals(cap, op="gdn", output="state", knobs={"state_dtype": ["bf16"], "accum_dtype": ["fp64"]})
    assert float(ds.share.sel(change="state_dtype=bf16")) > 0.9


def test_bundled_replay_gdn_and_merge():
    ds = replay(CAPTURES / "control", op="gdn", layer=0, rank=0, max_cases=3, backends=("torch", "oracle"))
    assert float(ds.err_captured.sel(variant="torch:default").max()) < 1e-5
    m = replay(CAPTURES / "candidate", op="qsa_merge", layer=3, rank=0, max_cases=2)
    assert m.sizes["case"] == 2
