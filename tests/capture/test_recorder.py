"""record(): a tiny random Qwen3-Next (GDN + full attention, no download) and toy modules."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import workbench
from workbench.capture.reader import open_capture
from workbench.capture.recorder import record, split_module_path
from workbench.errors import CaptureBudgetError, CaptureError, IncompleteCaptureError

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def qwen3_next():
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()  # "falling back to the PyTorch implementation" notices
    cfg = Qwen3NextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
        layer_types=["linear_attention", "full_attention", "linear_attention"],
        num_attention_heads=2, num_key_value_heads=1, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=8,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    return Qwen3NextForCausalLM(cfg).eval()


def _no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


IDS = torch.tensor([[5, 9, 17, 33, 2]])


def test_generate_prefill_and_two_decode_steps(qwen3_next, tmp_path):
    m = qwen3_next
    with torch.no_grad(), workbench.record(m, tmp_path / "cap", arm="control", run={"commit": "abc"}) as rec:
        m.generate(IDS, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        assert rec.step == 3 and rec.count > 0
    assert _no_hooks(m)
    cap = open_capture(tmp_path / "cap")
    idx = cap.index
    assert sorted(idx["step"].unique()) == [0, 1, 2]
    assert sorted(idx["layer"].unique()) == [-1, 0, 1, 2]
    ops = {layer: set(idx[idx["layer"] == layer]["op"]) for layer in (0, 1, 2)}
    assert {"linear_attn", "linear_attn.in_proj_qkvz", "linear_attn.in_proj_ba", "linear_attn.out_proj",
            "layer", "mlp", "mlp.experts", "input_layernorm"} <= ops[0]
    assert {"self_attn", "self_attn.q_proj", "self_attn.o_proj"} <= ops[1]
    assert not any(o.startswith("self_attn") for o in ops[0] | ops[2])
    assert {"lm_head", "model.embed_tokens", "model.norm", "root", "model"} <= set(idx[idx["layer"] == -1]["op"])
    # prefill sees the 5 prompt tokens, each decode step one
    for step, t in ((0, 5), (1, 1), (2, 1)):
        assert cap.get(step=step, layer=0, op="linear_attn.in_proj_qkvz", name="output").shape[1] == t
    # causal order: seq follows steps, then layers, and a call's input precedes its children's tensors
    assert idx["seq"].is_monotonic_increasing and idx["step"].is_monotonic_increasing
    layer_out = idx[(idx["op"] == "layer") & (idx["name"] == "output")]
    for _, g in layer_out.groupby("step"):
        assert g["layer"].tolist() == [0, 1, 2]
    s = idx[idx["step"] == 1].set_index(["layer", "op", "name"])["seq"]
    assert s[(0, "layer", "input")] < s[(0, "linear_attn.in_proj_qkvz", "output")] < s[(0, "layer", "output")]
    assert s[(0, "layer", "output")] < s[(1, "layer", "input")] < s[(-1, "lm_head", "output")]
    # names of keyword arguments and nested outputs
    assert "input.hidden_states" in set(idx[(idx["op"] == "self_attn")]["name"])
    assert {"input.position_embeddings.0", "input.position_embeddings.1"} <= set(idx[idx["op"] == "layer"]["name"])
    assert {"output.0", "output.1", "output.2"} <= set(idx[idx["op"] == "mlp.gate"]["name"])
    assert "output.logits" in set(idx[idx["op"] == "root"]["name"])
    run = cap.run
    assert run["commit"] == "abc" and run["model"] == "Qwen3NextForCausalLM"
    r = run["recorder"]
    assert r["modules"] == len(list(m.named_modules())) == r["hooked"]
    assert r["steps"] == 3 and r["truncated"] is False and r["torch"] == torch.__version__
    assert r["model_class"].endswith("Qwen3NextForCausalLM")


def test_recorded_values_match_a_plain_forward_with_cache(qwen3_next, tmp_path):
    m = qwen3_next
    with torch.no_grad():
        ref = m(IDS, use_cache=True)
        ref2 = m(torch.tensor([[7]]), cache=ref.past_key_values, use_cache=True)
        with record(m, tmp_path / "cap", arm="a", include=["", "lm_head"]) as rec:
            out = m(IDS, use_cache=True)
            out2 = m(torch.tensor([[7]]), cache=out.past_key_values, use_cache=True)
    cap = open_capture(tmp_path / "cap")
    assert rec.step == 2
    assert torch.equal(cap.get(step=0, op="root", name="output.logits"), ref.logits)
    assert torch.equal(cap.get(step=1, op="lm_head", name="output"), ref2.logits)
    assert torch.equal(cap.get(step=1, op="root", name="input"), torch.tensor([[7]]))
    assert torch.equal(out2.logits, ref2.logits)  # hooks do not change the computation
    assert set(cap.index["op"]) == {"root", "lm_head"}  # the cache object is not a tensor: ignored


@pytest.mark.parametrize("include, exclude, expect", [
    ("model.layers.*.linear_attn*", None, lambda ops: ops and all(o.startswith("linear_attn") for o in ops)),
    (None, ["*.mlp*", "*norm*", "*act_fn"], lambda ops: ops and not any("mlp" in o or "norm" in o for o in ops)),
    (lambda path, mod: isinstance(mod, nn.Linear), "lm_head",
     lambda ops: ops and all(o.endswith(("proj", "proj_qkvz", "proj_ba", "gate")) for o in ops)),
], ids=["include-glob", "exclude-list", "include-callable"])
def test_include_exclude_filters(qwen3_next, tmp_path, include, exclude, expect):
    with torch.no_grad(), record(qwen3_next, tmp_path / "cap", arm="a", include=include, exclude=exclude):
        qwen3_next(IDS)
    cap = open_capture(tmp_path / "cap")
    assert expect(set(cap.index["op"]))
    assert cap.run["recorder"]["hooked"] < len(list(qwen3_next.named_modules()))
    if include == "model.layers.*.linear_attn*":
        assert sorted(cap.index["layer"].unique()) == [0, 2]


@pytest.mark.parametrize("on_budget", ["raise", "warn"])
def test_byte_cap_stops_and_keeps_a_valid_capture(qwen3_next, tmp_path, on_budget):
    cap_bytes = 20_000
    ids = torch.randint(1, 64, (1, 8))
    if on_budget == "raise":
        with pytest.raises(CaptureBudgetError) as e:
            with torch.no_grad(), record(qwen3_next, tmp_path / "cap", arm="a", max_bytes=cap_bytes):
                qwen3_next(ids)
                pytest.fail("the forward that hit the cap must raise")
        assert "max_bytes" in e.value.fix and e.value.key["step"] == 0
    else:
        with pytest.warns(UserWarning, match="byte cap"):
            with torch.no_grad(), record(qwen3_next, tmp_path / "cap", arm="a", max_bytes=cap_bytes,
                                         on_budget="warn") as rec:
                qwen3_next(ids)
                qwen3_next(ids)
        assert rec.stopped and rec.step == 2
    assert _no_hooks(qwen3_next)
    cap = open_capture(tmp_path / "cap")
    assert cap.verify().ok and 0 < cap.total_bytes <= cap_bytes
    r = cap.run["recorder"]
    assert r["truncated"] is True and r["stopped_at"]["step"] == 0 and r["max_bytes"] == cap_bytes
    # the capture is a prefix of the full recording
    with torch.no_grad(), record(qwen3_next, tmp_path / "full", arm="a") as rec:
        qwen3_next(ids)
    full = open_capture(tmp_path / "full").keys()
    assert cap.keys() == full[:len(cap)]


def test_exception_inside_leaves_no_manifest_and_removes_hooks(qwen3_next, tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        with torch.no_grad(), record(qwen3_next, tmp_path / "cap", arm="a"):
            qwen3_next(IDS)
            raise RuntimeError("boom")
    assert _no_hooks(qwen3_next)
    with pytest.raises(IncompleteCaptureError):
        open_capture(tmp_path / "cap")


class Toy(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])
        self.shared = nn.Linear(4, 4)

    def forward(self, x, flag: bool = True, extra=None):
        for b in self.blocks:
            x = self.shared(b(x))
        x = self.shared(x)  # the third call of one module in a step
        return x, {"a": x * 2, "b": None, "c": [x, 3]}, "text"


def test_repeated_calls_nested_outputs_and_non_tensor_args(tmp_path):
    torch.manual_seed(0)
    toy = Toy()
    x = torch.randn(2, 4)
    with torch.no_grad(), record(toy, tmp_path / "cap", arm="a") as rec:
        toy(x, True, extra=(x, "s"))
        toy(x, flag=False)
    cap = open_capture(tmp_path / "cap")
    idx = cap.index
    s0 = idx[idx["step"] == 0]
    assert sorted(s0[s0["op"] == "shared"]["name"]) == sorted(
        ["input", "output", "input#1", "output#1", "input#2", "output#2"])
    assert set(s0[s0["op"] == "root"]["name"]) == {
        "input", "input.extra.0", "output.0", "output.1.a", "output.1.c.0"}
    assert set(idx[idx["op"] == "layer"]["layer"]) == {0, 1}  # blocks.<i> -> layer i, op "layer"
    assert set(idx[(idx["step"] == 1) & (idx["op"] == "shared")]["name"]) >= {"input", "input#2"}
    assert rec.step == 2


def test_mapper_and_bad_arguments(tmp_path):
    toy = Toy()
    with torch.no_grad(), record(toy, tmp_path / "cap", arm="a",
                                 mapper=lambda p, m: (7, "blk") if p.startswith("blocks") else None):
        toy(torch.randn(1, 4))
    idx = open_capture(tmp_path / "cap").index
    assert set(idx[idx["layer"] == 7]["name"]) == {"input", "output", "input#1", "output#1"}
    assert "shared" in set(idx["op"])
    with pytest.raises(CaptureError, match="mapper returned"):
        with record(toy, tmp_path / "cap2", arm="a", mapper=lambda p, m: ("x", 1)):
            pass
    assert _no_hooks(toy)
    for kw in ({"include": 3}, {"on_budget": "stop"}, {"max_bytes": -1}, {"mapper": "x"}):
        with pytest.raises(CaptureError):
            with record(toy, tmp_path / "cap3", arm="a", **kw):
                pass
    with pytest.raises(CaptureError, match="nn.Module"):
        with record(object(), tmp_path / "cap4", arm="a"):
            pass


@pytest.mark.parametrize("path, expected", [
    ("model.layers.3.linear_attn.in_proj_qkvz", (3, "linear_attn.in_proj_qkvz")),
    ("transformer.h.11.attn", (11, "attn")),
    ("encoder.layer.0", (0, "layer")),
    ("model.layers.x.mlp", (None, "model.layers.x.mlp")),
    ("lm_head", (None, "lm_head")),
    ("", (None, "")),
])
def test_split_module_path(path, expected):
    assert split_module_path(path) == expected


def test_record_sets_dims_from_module_globs(tmp_path):
    import pytest
    import torch

    from workbench.capture import open_capture
    from workbench.capture.recorder import record
    from workbench.errors import DimsError

    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 4))
    with record(model, tmp_path / "a", arm="a", dims={"0/output": "t i[tp]", "2/*": "t h[tp:partial]"}):
        model(torch.ones(3, 4))
    tags = {(r.op, r.name): r.tags.get("dims") for r in open_capture(tmp_path / "a").index.itertuples()}
    assert tags[("0", "output")] == "t i[tp]" and tags[("2", "output")] == "t h[tp:partial]"
    assert tags[("2", "input")] == "t h[tp:partial]" and tags[("1", "output")] is None
    with pytest.raises(DimsError, match="names 3 dim"):
        with record(model, tmp_path / "b", arm="b", dims={"0/output": "b t i[tp]"}):
            model(torch.ones(3, 4))


class _Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def test_tags_module_path_class_and_distributed_rank(tmp_path):
    """Every tensor names the module that produced it; under torch.distributed the rank and world
    size come from the process group (a one-process gloo group here)."""
    import torch.distributed as dist

    m = _Two()
    with record(m, tmp_path / "a", arm="a") as rec:
        m(torch.ones(1, 4))
    row = open_capture(tmp_path / "a").select(layer=1, name="output").index.iloc[0]
    assert row["tags"]["module"] == "layers.1" and row["tags"]["module_class"] == "Linear"
    assert "world_size" not in row["tags"] and row["rank"] == 0
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with record(m, tmp_path / "b", arm="b"):
            m(torch.ones(1, 4))
    finally:
        dist.destroy_process_group()
    cap = open_capture(tmp_path / "b")
    assert set(cap.index["tags"].map(lambda t: (t["world_rank"], t["world_size"]))) == {(0, 1)}
    assert cap.run["parallel"] == {"world_size": 1}
    with pytest.raises(CaptureError, match="rank must be an int"):
        with record(m, tmp_path / "c", arm="c", rank=-1):
            pass


def test_refuses_to_record_inside_cuda_graph_capture(tmp_path, monkeypatch):
    import workbench.capture.recorder as recorder

    monkeypatch.setattr(recorder, "_capturing_cuda_graph", lambda: True)
    m = _Two()
    with pytest.raises(CaptureError, match="inside CUDA graph capture") as e:
        with record(m, tmp_path / "g", arm="g"):
            m(torch.ones(1, 4))
    assert "without CUDA graphs" in e.value.fix
    assert _no_hooks(m)
    with pytest.raises(IncompleteCaptureError):  # nothing half-written is taken for a capture
        open_capture(tmp_path / "g")
