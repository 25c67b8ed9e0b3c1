from pathlib import Path


from workbench.widgets import CaptureExplorer, ReplayPanel

CAPTURES = Path(__file__).resolve().parents[2] / "captures"


def _ys(live):
    return [tuple(d.y) for d in live.figure.data]


def test_explorer_updates_in_place():
    ex = CaptureExplorer(CAPTURES / "control", CAPTURES / "candidate", aa=CAPTURES / "control-repeat", step=[0, 1])
    before = _ys(ex.by_layer)
    ex.controls["op"].value = "gdn"
    assert _ys(ex.by_layer) != before
    before = _ys(ex.by_step)
    ex.controls["metric"].value = "max_abs"
    assert _ys(ex.by_step) != before


def test_replay_panel_runs():
    p = ReplayPanel(CAPTURES / "control", op="gdn", layer=0, rank=0, max_cases=2)
    p.run()
    n = len(p.figure.figure.data)
    p.knobs["state_dtype"].value = "bf16"
    p.run()
    assert len(p.figure.figure.data) == n + 1


def test_graft_panel_grafts_the_chosen_tensors_and_redraws():
    """The graft form on a tiny random HF Llama whose layer-2 down projection is 1% off: it offers
    the ops that differ (the first divergence's chosen), grafts what is picked, and redraws."""
    import copy

    import pytest
    import torch

    transformers = pytest.importorskip("transformers")
    from workbench.capture.recorder import ModelRerun
    from workbench.errors import AnalysisError
    from workbench.widgets import GraftPanel

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    control = transformers.LlamaForCausalLM(cfg).eval()
    candidate = copy.deepcopy(control)
    with torch.no_grad():
        w = candidate.model.layers[2].mlp.down_proj.weight
        w.mul_(1 + 0.01 * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
    ids = torch.tensor([[3, 14, 15, 9, 26, 5]])
    opts = dict(include=["model.layers.*"], exclude=["*rotary_emb*"])
    ctl = ModelRerun(control, lambda m: m(ids), arm="control", **opts)({})
    panel = GraftPanel(ModelRerun(candidate, lambda m: m(ids), arm="candidate", **opts), ctl)
    assert panel.op.value == (0, 0, 2, "mlp.down_proj") == panel.first
    assert all(k[2] >= 2 for k in panel.ops)  # nothing before layer 2 differs
    assert panel.names.value == ("input",)
    ds = panel.run()
    assert "starts in this op" in ds.attrs["verdict"] and "starts in this op" in panel.status.value
    drawn = panel.figure.figure.data
    assert [t.name for t in drawn if t.yaxis in (None, "y")] == ["candidate", "grafted"]
    # keys the graft makes bit-identical are in the strip under the plot, not at a made-up value
    zero = [t for t in drawn if t.yaxis == "y9"]
    assert [t.name for t in zero] == ["candidate: bit-identical", "grafted: bit-identical"]
    for t in zero:  # exactly the keys whose error is 0 (the layers before the fault)
        v = ds.value.sel(variant=t.legendgroup).values
        assert list(t.x) == ds.seq.values[v == 0].tolist() and len(t.x) > 0
    assert all(y is None or y > 0 for t in drawn if t.yaxis in (None, "y") for y in t.y)
    assert panel.figure.draws == 1
    panel.choose((0, 0, 2, "mlp"), ["output"])
    assert panel.run().attrs["downstream_agrees"] == 1
    with pytest.raises(AnalysisError, match="not one of the ops that differ"):
        panel.choose((0, 0, 0, "mlp"), ["output"])
    with pytest.raises(AnalysisError, match="no tensor"):
        panel.choose((0, 0, 2, "mlp"), ["nope"])
    same = GraftPanel(ModelRerun(control, lambda m: m(ids), arm="same", **opts), ctl)
    assert same.ops == [] and same.button.disabled and "nothing to graft" in same.status.value
