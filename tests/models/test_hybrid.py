"""The hybrid decoder: determinism, TP sharding, arm configuration, what it records."""

import json

import pytest
import torch

from workbench.capture import CaptureWriter, open_capture
from workbench.errors import WorkbenchError
from workbench.models.hybrid import ArmConfig, HybridConfig, HybridDecoder, Override, RecordSpec
from workbench.numerics.metrics import compare
from workbench.numerics.policy import Policy

STEPS = 3


@pytest.fixture(scope="module")
def model():
    return HybridDecoder(HybridConfig())


class Grab:
    """A writer stand-in that keeps every tensor by key."""

    def __init__(self):
        self.t = {}

    def add(self, t, *, rank, step, layer, op, name, **tags):
        self.t[(rank, step, layer, op, name)] = t.clone()


def _run(model, arm, spec=None, prompt=256):
    g = Grab()
    toks = model.generate(model.prompt(prompt), steps=STEPS, arm=arm, writer=g,
                          spec=spec or RecordSpec(detail_steps=None))
    return toks, g.t


def test_layer_pattern_and_selection_is_sparse(model):
    c = model.config
    assert [c.layer_kind(i) for i in range(c.n_layers)] == ["gdn", "gdn", "gdn", "qsa"] * 2
    _, t = _run(model, ArmConfig(tp=1))
    idx = t[(0, 1, 3, "qsa", "indices")]  # decode step 1: position 256
    assert idx.shape == (1, c.budget + c.ratio - 1)
    assert int((idx >= 0).sum()) == c.budget + 1  # 16 blocks of 257 tokens + the open tail, not all
    assert t[(0, 1, -1, "lm_head", "logits")].dtype == torch.bfloat16


def test_generate_is_deterministic(model):
    a_tok, a = _run(model, ArmConfig())
    b_tok, b = _run(model, ArmConfig())
    assert a_tok == b_tok and a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("tp", [2, 4], ids=lambda tp: f"tp{tp}")
def test_tensor_parallel_equals_single_rank_within_fp32_noise(model, tp):
    one_tok, one = _run(model, ArmConfig(tp=1))
    many_tok, many = _run(model, ArmConfig(tp=tp))
    assert one_tok == many_tok
    assert {k[0] for k in many} == set(range(tp))
    for step in range(STEPS + 1):
        for key in [(0, step, 7, "layer", "output"), (0, step, -1, "lm_head", "input")]:
            c = compare(one[key], many[key])
            assert c.rel_l2 < 1e-5, (key, str(c))
    # the sharded GDN state of all ranks together is the single-rank state
    S = torch.cat([many[(r, STEPS, 0, "gdn", "state")] for r in range(tp)])
    assert compare(one[(0, STEPS, 0, "gdn", "state")], S).rel_l2 < 1e-5


def test_arm_policy_overrides_and_metadata():
    arm = ArmConfig(qsa=Policy(num_kv_splits=2),
                    overrides=(Override("qsa", {"prob_dtype": "fp16"}, layers=(3,), ranks=(1,)),))
    assert arm.policy("qsa", 3, 1).prob_dtype == "fp16"
    assert arm.policy("qsa", 3, 0).prob_dtype == "fp32" and arm.policy("qsa", 7, 1).prob_dtype == "fp32"
    assert arm.policy("qsa", 3, 1).num_kv_splits == 2
    d = json.loads(json.dumps(arm.to_dict()))
    assert d["backends"]["gdn"] == "torch" and d["overrides"][0]["ranks"] == [1]
    with pytest.raises(WorkbenchError, match="sampler"):
        ArmConfig(sampler="beam")
    with pytest.raises(WorkbenchError, match="knob"):
        ArmConfig(overrides=(Override("gdn", {"no_such_knob": 1}),))
    with pytest.raises(WorkbenchError, match="cannot be split"):
        HybridDecoder(HybridConfig(n_layers=1)).generate(torch.arange(8), steps=0, arm=ArmConfig(tp=3))


def test_stateless_draw_sampler_is_seeded(model):
    small = HybridDecoder(HybridConfig(n_layers=4))
    arm = ArmConfig(sampler="draw", draw_seed=3)
    p = small.prompt(32)
    assert small.generate(p, steps=4, arm=arm) == small.generate(p, steps=4, arm=arm)


def test_records_into_a_capture_with_the_spec(model, tmp_path):
    spec = RecordSpec(detail_steps=(0,), prefill_positions=8)
    with CaptureWriter(tmp_path / "c", arm="control") as w:
        toks = model.generate(model.prompt(256), steps=2, arm=ArmConfig(), writer=w, spec=spec)
    cap = open_capture(tmp_path / "c")
    ix = cap.index
    assert set(ix["rank"]) == {0, 1} and set(ix["step"]) == {0, 1, 2}
    assert set(ix[ix.step == 1]["op"] + "/" + ix[ix.step == 1]["name"]) == set(spec.every_step)
    q = ix[(ix.step == 0) & (ix.layer == 0) & (ix.op == "gdn") & (ix.name == "q")].iloc[0]
    assert q["shape"][0] == 8 and q["tags"]["positions"] == "248:256"
    assert [int(cap.get(rank=0, step=s, layer=-1, op="sampler", name="token")[0]) for s in range(3)] == toks
    # causal order: within a layer the mixer input comes before its internals and output
    l3 = ix[(ix.step == 0) & (ix.layer == 3) & (ix["rank"] == 0)].sort_values("seq")
    names = list(l3["op"] + "/" + l3["name"])
    assert names[0] == "qsa/input" and names.index("qsa/index_scores") < names.index("qsa/partial_o") < \
        names.index("qsa/output")


def test_chunked_prefill_against_unchunked_at_model_level(tmp_path):
    """The seed case: a 128-token prompt prefilled in one call against 64 + 64, every GDN layer's
    recurrent and conv state after the prompt, the last-token logits and token, and the first
    decode step's, compared by (request, position)."""
    from workbench.analysis import compare_captures
    from workbench.capture import CaptureWriter
    from workbench.models.hybrid import ArmConfig, HybridConfig, HybridDecoder, RecordSpec
    from workbench.numerics.policy import Policy

    model = HybridDecoder(HybridConfig(n_layers=4))
    spec = RecordSpec(detail_steps=None, prefill_positions=None, batch_rows=True, conv_state=True)

    def run(name, **arm):
        with CaptureWriter(tmp_path / name, arm=name) as w:
            toks = model.generate(model.prompt(128), steps=1, arm=ArmConfig(name=name, **arm), writer=w, spec=spec)
        return tmp_path / name, toks

    (one, t1), (chunked, t2) = run("one-call"), run("chunked", prefill_chunk=64)
    assert t1 == t2 and len(t2) == 2  # the token after the prompt and after one decode step
    res = compare_captures(one, chunked)
    assert res.align == "tokens" and res.first_divergence() is None, res.describe_first()
    t = res.table.set_index(["step", "layer", "op", "name", "rank"])
    for layer in (0, 1, 2):
        for name in ("state", "conv_state_q", "conv_state_k", "conv_state_v"):
            assert t.loc[(0, layer, "gdn", name, 0), "status"] == "ok"  # after token 127, from chunk 2 of the candidate
    for step in (0, 1):
        assert t.loc[(step, -1, "lm_head", "logits", 0), "status"] == "ok"
        assert t.loc[(step, -1, "sampler", "token", 0), "n_diff"] == 0
    # a state rounded to bf16 at the chunk boundary: found in the first GDN layer's state after the prompt
    bad, _ = run("bf16-handoff", prefill_chunk=64, gdn=Policy(state_dtype="bf16"))
    fd = compare_captures(one, bad).first_divergence()
    assert (fd["step"], fd["layer"], fd["op"]) == (0, 0, "gdn"), fd


def test_arm_round_trips_and_bundled_captures_rerun():
    """ArmConfig.from_dict reads back every bundled capture's arm; rerun_from_capture re-runs the
    base decoder's captures (not the tie/split-K models, whose weights were edited), and bisect
    on the bundled pair finds the fp16-probability QSA in layer 3, and the same defect in layer 7."""
    from pathlib import Path

    from workbench.analysis import Rule, bisect
    from workbench.capture import open_capture
    from workbench.models.hybrid import ArmConfig, rerun_from_capture

    root = Path(__file__).resolve().parents[2] / "captures"
    for d in sorted(root.iterdir()):
        run = open_capture(d).run
        if str(run.get("model", "")).endswith("HybridDecoder"):
            assert ArmConfig.from_dict(run["arm"]).to_dict() == run["arm"], d.name
    assert rerun_from_capture(open_capture(root / "tie-candidate"), steps=0) is None
    assert rerun_from_capture(open_capture(root / "hf-qwen3next-control"), steps=0) is None
    ctl, cand, aa = (rerun_from_capture(open_capture(root / n), steps=0)
                     for n in ("control", "candidate", "control-repeat"))
    res = bisect(cand, ctl({}), aa=aa({}), rules=[Rule("*")])
    assert res["origin"] == (0, 0, 3, "qsa") and res["heals"] is False
    assert res["next"][2] == 7 and res["next"][3] == "qsa"
