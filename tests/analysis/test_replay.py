import json
from pathlib import Path

import pytest
import torch

from workbench.analysis import counterfactuals, describe_counterfactuals, replay
from workbench.analysis.replay import OpAdapter, replay_cases
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


def test_bundled_qsa_decode_replays_every_recorded_case():
    """The bundled decoder records the sparse decode's inputs (paged K/V cache, block table, q,
    indices) at its 9 detail steps, in each of its 2 QSA layers on 2 ranks: 36 cases, prefill rows
    included (sliced like q). Replayed with the control's policy they reproduce the control's output
    to fp32 noise; on the candidate the fp16-probability change reproduces what the tensors show."""
    cases = replay_cases(CAPTURES / "candidate", op="qsa")
    assert len(cases) == 36 and {c[2] for c in cases} == {3, 7} and {c[0] for c in cases} == {0, 1}
    base = Policy(num_kv_splits=2)
    ctl = counterfactuals(CAPTURES / "control", op="qsa", base=base, knobs={"prob_dtype": ["fp16"]})
    assert ctl.attrs["reproduced_by"] == "base"
    assert float(ctl.err_captured.sel(change="base").max()) < 1e-6
    assert int(ctl.n_closer_captured.sel(change="prob_dtype=fp16")) == 0
    cf = counterfactuals(CAPTURES / "candidate", op="qsa", base=base, knobs={"prob_dtype": ["fp16"]})
    assert cf.attrs["reproduced_by"] == "prob_dtype=fp16"
    fp16 = cf.sel(change="prob_dtype=fp16")
    assert int(fp16.n_closer_captured) == 36
    # the base's replay is as far from the capture as fp16 rounding of P makes it; fp16's is fp32
    # noise in most cases (a score that lands on the other side of an fp16 rounding boundary after
    # fp32 reassociation moves a case to ~1e-5, still closer than the base's ~1e-4)
    assert float(cf.median_err_captured.sel(change="base")) > 100 * float(fp16.median_err_captured)
    assert float(fp16.median_err_captured) < 1e-6
    lines = describe_counterfactuals(cf)
    assert lines[1].startswith("prob_dtype=fp16: closer to the captured o in 36 of 36 cases; median rel. L2 vs captured ")
    # judged against FP64 too: the fp16 probabilities are the farther from the truth
    assert float(fp16.median_err_oracle) > 100 * float(cf.median_err_oracle.sel(change="base"))


def test_a_user_registered_adapter_replays_captures_with_other_names(tmp_path):
    """Replay knows no model's names: an adapter registered for a capture of an lm_head GEMM
    (names x / weight / logits, as a user's recorder writes them) replays it through gemm."""
    from workbench.analysis.replay import REGISTRY, OpAdapter, adapters, register_adapter
    from workbench.kernels import gemm

    g = torch.Generator().manual_seed(3)
    x, wt = torch.randn(2, 256, generator=g), torch.randn(32, 256, generator=g)
    w = CaptureWriter(tmp_path / "c", arm="c")
    for step in range(3):
        xs = x + step
        w.add(xs, step=step, layer=-1, op="lm_head", name="x")
        w.add(wt, step=step, layer=-1, op="lm_head", name="weight")
        w.add(gemm.splitk_matmul(xs, wt, splits=8, partial_dtype="bf16"), step=step, layer=-1, op="lm_head",
              name="logits")
    w.close()

    def load(cap, rank, step, layer):
        return {n: cap.get(op="lm_head", rank=rank, step=step, layer=layer, name=n) for n in ("x", "weight")}

    def run(inp, backend, policy):
        return {"logits": gemm.splitk_matmul(inp["x"], inp["weight"], backend=backend, policy=policy)}

    state = REGISTRY.snapshot()
    try:
        register_adapter("lm_head_gemm", OpAdapter("lm_head", ("x", "weight"), ("logits",), load, run,
                                                   knobs={"partial_dtype": ["bf16"]}))
        assert "lm_head_gemm" in adapters()
        ds = replay(tmp_path / "c", op="lm_head_gemm", policies=[Policy(splitk=8), Policy(splitk=8, partial_dtype="bf16")])
        assert ds.sizes["case"] == 3
        # the bf16-partial variant reproduces the captured logits exactly; fp32 partials beat them vs FP64
        assert float(ds.err_captured.sel(variant=Policy(splitk=8, partial_dtype="bf16").label()).max()) == 0.0
        assert int(ds.n_closer.sel(variant=Policy(splitk=8).label())) == 3
        cf = counterfactuals(tmp_path / "c", op="lm_head_gemm", base=Policy(splitk=8))  # the adapter's knobs
        assert float(cf.delta.sel(change="partial_dtype=bf16")) > 0
    finally:
        REGISTRY.restore(state)
    with pytest.raises(AnalysisError, match="must be one of") as e:
        replay(tmp_path / "c", op="lm_head_gemm")
    assert "register_adapter" in e.value.fix


def test_bundled_adapters_exist_without_installed_metadata():
    # a checkout used without `pip install` (PYTHONPATH only: the GPU machine) has no entry points
    from workbench.analysis.replay import REGISTRY
    for name in ("gdn", "gdn_chunked", "qsa_merge", "qsa"):
        assert REGISTRY.entry(name).source == "builtin"
        assert isinstance(REGISTRY.load(name), OpAdapter)


def _packed_prefill_capture(path, lengths, seed):
    """What an engine dumps for a packed prefill: q, k, v, g, beta of the sequences packed along
    T, cu_seqlens, the per-sequence initial states, and the outputs (core, state) of a run with a
    bf16 state (torch's recurrence)."""
    from workbench.kernels.gdn._cases import packed_inputs
    x = packed_inputs(lengths, H=2, HV=4, K=8, V=8, seed=seed)
    o, s = gdn.recurrent(**x, qk_l2norm=True, backend="torch", policy={"state_dtype": "bf16"})
    with CaptureWriter(path, arm="packed") as w:
        for n in ("q", "k", "v", "g", "beta"):
            w.add(x[n][0], op="linear_attn", name=n, layer=0)
        w.add(torch.tensor(x["cu_seqlens"], dtype=torch.int32), op="linear_attn", name="cu_seqlens", layer=0)
        w.add(x["initial_state"], op="linear_attn", name="initial_state", layer=0)
        w.add(o[0], op="linear_attn", name="core", layer=0)
        w.add(s, op="linear_attn", name="state", layer=0)
    return open_capture(path)


def test_a_packed_prefill_replays_as_it_was_run(tmp_path):
    # an engine packs three prefill sequences along T and dumps cu_seqlens and the per-sequence
    # initial states next to q, k, v, g, beta; the replay runs them packed, as the engine did
    ds = replay(_packed_prefill_capture(tmp_path / "cap", [5, 1, 23], seed=4), op="gdn", capture_op="linear_attn", output="state",
                policies={"fp32": Policy(), "bf16": Policy(state_dtype="bf16")})
    assert ds.attrs["n_cases"] == 1
    assert float(ds.err_captured.sel(variant="bf16").max()) == 0.0  # reproduced bit for bit, packed
    assert float(ds.err_captured.sel(variant="fp32").min()) > 1e-4


def test_a_packed_prefill_replays_through_the_chunked_kernels(tmp_path):
    # gdn_chunked: the same captured cases through gdn.chunked, the kernels engines run prefill
    # with; a chunked-only backend (flashinfer) is then a candidate, skipped here for what it
    # lacks (no FlashInfer, no GPU), not for the op
    cap = _packed_prefill_capture(tmp_path / "cap", [5, 1, 0, 70], seed=6)
    ds = replay(cap, op="gdn_chunked", capture_op="linear_attn", output="state",
                backends=("torch", "ext", "flashinfer"))
    assert ds.attrs["op"] == "gdn_chunked" and ds.attrs["n_cases"] == 1
    for b in ("torch", "ext"):
        assert float(ds.err_oracle.sel(variant=f"{b}:default").max()) < 1e-5, b
        assert int(ds.n_closer.sel(variant=f"{b}:default")) == 1  # fp32 beats the bf16-state capture
    assert "flashinfer" in ds.attrs["skipped"] and "cannot run here" in ds.attrs["skipped"]
    assert any(r["op"] == "chunked" and r["backend"] == "torch" for r in json.loads(ds.attrs["kernels"]))
