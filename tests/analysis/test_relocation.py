from pathlib import Path

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


def test_captured_decode_inputs_need_every_selected_position(tmp_path):
    import pytest
    import torch

    from workbench.analysis.relocation import captured_decode_inputs, find_attention_inputs
    from workbench.capture import CaptureWriter, open_capture
    from workbench.errors import AnalysisError

    g = torch.Generator().manual_seed(0)
    with CaptureWriter(tmp_path / "c", arm="x") as w:
        for step, (a, b) in enumerate([(0, 12), (12, 13)]):
            w.add(torch.randn(b - a, 2, 8, generator=g), step=step, layer=5, op="attn", name="q")
            for n in ("k", "v"):
                w.add(torch.randn(b - a, 1, 8, generator=g), step=step, layer=5, op="attn", name=n)
            w.add(torch.tensor([[0, 3, b - 1, -1]] * (b - a), dtype=torch.int32), step=step, layer=5, op="attn", name="indices")
    cap = open_capture(tmp_path / "c")
    assert find_attention_inputs(cap) == "attn"
    q, k, v, idx = captured_decode_inputs(cap, op="attn")[5]
    assert q.shape == (1, 2, 8) and k.shape == (1, 13, 1, 8) and idx.tolist() == [[0, 3, 12, -1]]
    assert torch.equal(k[0, 12], cap.get(op="attn", name="k", step=1)[0])
    with pytest.raises(AnalysisError, match="k/v recorded for some positions only"):
        captured_decode_inputs(Path(__file__).resolve().parents[2] / "captures" / "control", op="qsa")


def test_model_level_story_first_divergence_growth_and_restoration():
    from workbench.analysis.relocation import describe_relocation_model, relocation_model
    from workbench.models.hybrid import ArmConfig, HybridConfig, HybridDecoder
    from workbench.numerics.policy import Policy

    model = HybridDecoder(HybridConfig(n_layers=6, vocab=128))
    prompt = model.prompt(24)
    ds = relocation_model(model, prompt, arm=ArmConfig(name="r", tp=2, qsa=Policy(num_kv_splits=2)), steps=1,
                          n_relocations=3)
    phys, log = ds.sel(order="physical"), ds.sel(order="logical")
    # canonical (logical) order: every relocation bitwise identical in every tensor, both ranks, the log-probs
    assert (log.first_key.values == "").all() and log.hidden_bitwise.all() and log.logprob_bitwise.all()
    assert (log.ranks_bitwise.values == 2).all() and (log.growth.values == 0).all()
    # physical order: the first QSA layer (3) parts first, with its inputs bitwise equal
    for k in phys.first_key.values:
        assert k.startswith("rank=0 step=0 layer=3 op=qsa"), k
    assert (phys.qsa_inputs_equal.values == 1.0).all() and not phys.hidden_bitwise.any()
    # layers before the QSA layer are untouched; after it the difference is there and reaches the final hidden state
    g = phys.growth.values
    assert (g[:, :3] == 0).all() and (g[:, 3:] > 0).all()
    assert (phys.hidden_rel_l2.values > 0).all()
    text = describe_relocation_model(ds)
    assert text[1].startswith("logical page order: 3 of 3 relocations bitwise identical")
    assert "with that QSA layer's inputs bitwise equal in 3/3" in text[0]
