import torch

from workbench.analysis import relocation_invariance, relocation_invariance_captures
from workbench.models.hybrid import HybridRerun


def test_logical_invariant_physical_not():
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 64, 1, 16, generator=g), torch.randn(1, 64, 1, 16, generator=g)
    idx = torch.arange(64, dtype=torch.int32)[None]
    layers = {0: (torch.randn(1, 4, 16, generator=g), k, v, idx), 3: (torch.randn(1, 4, 16, generator=g), k, v, idx)}
    ds = relocation_invariance(layers, num_splits=4, spare_pages=4)
    assert bool(ds.invariant.sel(page_order="logical").all())
    assert not bool(ds.invariant.sel(page_order="physical").any())
    assert ds.attrs["failing_orders"] == "physical"


def test_hybrid_model_relocation_per_layer():
    from workbench.models.hybrid import ArmConfig, HybridConfig, HybridDecoder
    from workbench.numerics.policy import Policy
    m = HybridDecoder(HybridConfig(n_layers=4, vocab=64))
    p = m.prompt(40)
    out = {}
    for order in ("logical", "physical"):
        arm = ArmConfig(name=order, qsa=Policy(num_kv_splits=2, page_order=order))
        ref = HybridRerun(m, arm, p, steps=0)({})
        moved = HybridRerun(m, arm.replace(page_seed=7), p, steps=0)({})
        out[order] = relocation_invariance_captures(ref, {"moved": moved}, names=("partial_o", "o", "gated"))
    assert bool(out["logical"].invariant.all())
    assert not bool(out["physical"].invariant.all())
