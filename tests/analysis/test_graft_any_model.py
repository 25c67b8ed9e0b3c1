"""Grafts on a model the workbench knows nothing about: a tiny random Hugging Face Llama driven
through the recorder's ModelRerun (forward hooks return the grafted tensors)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from workbench.analysis import graft
from workbench.capture.recorder import ModelRerun, record
from workbench.capture import open_capture
from workbench.errors import GraftError, IncompleteCaptureError

transformers = pytest.importorskip("transformers")

IDS = torch.tensor([[3, 14, 15, 9, 26, 5]])


@pytest.fixture(scope="module")
def llama_pair():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    control = LlamaForCausalLM(cfg).eval()
    candidate = copy.deepcopy(control)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the "kernel change": layer 2's down projection is 1% off
        w = candidate.model.layers[2].mlp.down_proj.weight
        w.mul_(1 + 0.01 * torch.randn(w.shape, generator=g))
    return control, candidate


def _run(m):
    return m(IDS)


OPTS = dict(include=["model.layers.*"], exclude=["*rotary_emb*"])


def test_graft_finds_the_op_at_fault_and_clears_downstream(llama_pair, tmp_path):
    control, candidate = llama_pair
    ctl = ModelRerun(control, _run, arm="control", **OPTS)({})
    rerun = ModelRerun(candidate, _run, arm="candidate", **OPTS)
    ds = graft(rerun, ctl, replace="input")  # at the first divergence, found from the tensors
    assert (ds.attrs["at_layer"], ds.attrs["at_op"]) == (2, "mlp.down_proj")
    assert ds.attrs["op_agrees"] == 0 and "starts in this op" in ds.attrs["verdict"]
    # with the control's MLP output, nothing after layer 2's MLP diverges
    out = graft(rerun, ctl, at=dict(rank=0, step=0, layer=2, op="mlp"), replace="output")
    assert out.attrs["downstream_agrees"] == 1, out.attrs["verdict"]
    # what still diverges in the grafted run is inside the MLP, before its grafted output
    assert json.loads(out.attrs["first_after_key"]) == [0, 0, 2, "mlp.down_proj", "output"]
    assert "layer=2 op=mlp.down_proj" in out.attrs["first_before"]
    assert rerun.runs == 4  # each graft: rerun({}) for the un-grafted candidate, then the grafted run
    assert out.variant.values.tolist() == ["candidate", "grafted"]


def test_graft_of_an_input_changes_what_the_model_computes(llama_pair, tmp_path):
    control, _ = llama_pair
    with torch.no_grad(), record(control, tmp_path / "base", arm="a", **OPTS):
        control(IDS)
    base = open_capture(tmp_path / "base")
    x = base.get(step=0, layer=1, op="mlp", name="input")
    key = (0, 0, 1, "mlp", "input")
    with torch.no_grad(), record(control, tmp_path / "g", arm="a", overrides={key: torch.zeros_like(x)}, **OPTS):
        control(IDS)
    g = open_capture(tmp_path / "g")
    assert torch.equal(g.get(step=0, layer=1, op="mlp", name="input"), torch.zeros_like(x))
    assert not torch.equal(g.get(step=0, layer=1, op="mlp", name="output"),
                           base.get(step=0, layer=1, op="mlp", name="output"))
    assert torch.equal(g.get(step=0, layer=0, op="layer", name="output"),
                       base.get(step=0, layer=0, op="layer", name="output"))  # upstream untouched
    assert g.run["graft"] == [list(key)]


def test_bad_overrides_are_typed_errors_and_leave_no_finished_capture(llama_pair, tmp_path):
    control, _ = llama_pair
    with pytest.raises(GraftError, match="never produced"):
        with torch.no_grad(), record(control, tmp_path / "a", arm="a",
                                     overrides={(0, 5, 1, "mlp", "input"): torch.zeros(1)}, **OPTS):
            control(IDS)
    with pytest.raises(IncompleteCaptureError):  # no manifest: never mistaken for a finished run
        open_capture(tmp_path / "a")
    with pytest.raises(GraftError, match="shape"):
        with torch.no_grad(), record(control, tmp_path / "b", arm="a",
                                     overrides={(0, 0, 1, "mlp", "input"): torch.zeros(3)}, **OPTS):
            control(IDS)
    with pytest.raises(IncompleteCaptureError):
        open_capture(tmp_path / "b")
    with pytest.raises(GraftError, match="rank, step, layer, op, name"):
        ModelRerun(control, _run)({("mlp", "input"): torch.zeros(1)})


def test_bisect_names_where_the_fault_starts(llama_pair):
    """The 1% down_proj change: its op still diverges with the control's inputs, and grafting its
    output heals every later key. A second fault downstream is named as such."""
    from workbench.analysis import bisect

    control, candidate = llama_pair
    ctl = ModelRerun(control, _run, arm="control", **OPTS)({})
    res = bisect(ModelRerun(candidate, _run, arm="candidate", **OPTS), ctl)
    assert res["origin"] == (0, 0, 2, "mlp.down_proj") and res["heals"] is True and res["next"] is None
    g = res["graft"]  # the origin's outputs from the control: what first_divergence draws offline
    assert g.attrs["verdict"] and not g.exceeded.sel(variant="grafted").values[g.seq.values > g.attrs["graft_seq"]].any()
    assert "the fault starts in rank 0, step 0, layer 2, mlp.down_proj" in res["verdict"]
    assert res["tries"][0]["agrees"] is False and res["tries"][0]["replaced"] == ["input"]
    two = copy.deepcopy(candidate)
    with torch.no_grad():
        two.model.layers[3].mlp.down_proj.weight.mul_(1.02)  # a second fault, later
    res2 = bisect(ModelRerun(two, _run, arm="two", **OPTS), ctl)
    assert res2["origin"] == (0, 0, 2, "mlp.down_proj") and res2["heals"] is False
    assert res2["next"][2] == 3 and "another fault downstream" in res2["verdict"]
    with pytest.raises(Exception, match="nothing to bisect"):
        bisect(ModelRerun(control, _run, arm="same", **OPTS), ctl)


def test_bisect_follows_an_amplified_difference_to_its_origin(llama_pair):
    """A tiny change at layer 1's down_proj that the rules only see from layer 3 on: the first
    divergence's op agrees with the control's inputs, so bisect looks for the first op that changes
    bits from identical inputs, and finds layer 1's down_proj."""
    from workbench.analysis import Rule, bisect

    control, _ = llama_pair
    ctl = ModelRerun(control, _run, arm="control", **OPTS)({})
    tiny = copy.deepcopy(control)
    with torch.no_grad():
        tiny.model.layers[1].mlp.down_proj.weight.mul_(1 + 2e-4)
    rules = [Rule("layer[0-2]/*", threshold=1.0), Rule("*", threshold=1e-6)]  # blind before layer 3
    res = bisect(ModelRerun(tiny, _run, arm="tiny", **OPTS), ctl, rules=rules)
    assert res["first_divergence"][2] == 3
    assert res["tries"][0]["agrees"] is True  # the layer-3 op computes the same from the control's inputs
    assert res["origin"] == (0, 0, 1, "mlp.down_proj"), res
    assert "bit-identical inputs" in res["how"] and res["heals"] is True


def test_bisect_names_a_parent_whose_own_code_changes_the_bits(llama_pair):
    """Layer 2's MLP rounds its input and output to bf16 in its own forward (outside its child
    projections): the first divergence is a child's input, every child computes the same bits from
    the control's inputs, and the origin is the MLP itself."""
    from workbench.analysis import bisect

    control, _ = llama_pair
    ctl = ModelRerun(control, _run, arm="control", **OPTS)({})
    cand = copy.deepcopy(control)
    mlp = cand.model.layers[2].mlp
    fwd = mlp.forward
    mlp.forward = lambda x: fwd(x.bfloat16().float()).bfloat16().float()
    res = bisect(ModelRerun(cand, _run, arm="bf16-mlp", **OPTS), ctl)
    assert res["first_divergence"][3].startswith("mlp.")  # a child of the MLP
    assert res["origin"] == (0, 0, 2, "mlp") and res["heals"] is True, res["verdict"]


def test_bisect_on_qwen3_next_finds_the_gdn_kernel_change():
    """The bundled tiny Qwen3-Next (3 linear-attention layers, then full attention), with the
    workbench GDN kernel patched in on both arms; the candidate's reads q, k and v in bf16.
    The fault is inside each linear-attention block's own code (the gated delta rule is a function,
    not a submodule): bisect names layer 0's linear_attn, and grafting its output does not heal
    (layers 1 and 2 run the same kernel), so the next fault is named downstream."""
    from workbench.analysis import Rule, bisect
    from workbench.models.hf_qwen3next import HF_INCLUDE, build_model, prompt_ids, workbench_gdn
    from workbench.numerics.policy import Policy

    model, ids = build_model(), prompt_ids()

    def runner(policy):
        def run(m):
            with workbench_gdn(backend="torch", policy=policy):
                return m(ids)
        return run

    ctl = ModelRerun(model, runner(Policy()), arm="control", include=HF_INCLUDE)({})
    cand = ModelRerun(model, runner(Policy(input_dtype="bf16")), arm="bf16-inputs", include=HF_INCLUDE)
    res = bisect(cand, ctl, rules=[Rule("*", threshold=1e-4)])  # both arms: the same kernel, this process
    assert res["origin"] == (0, 0, 0, "linear_attn"), res["verdict"]
    assert res["heals"] is False and res["next"][2] == 1, res["verdict"]
    assert "another fault downstream" in res["verdict"]
