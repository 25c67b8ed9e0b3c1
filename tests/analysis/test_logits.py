import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from workbench.analysis.logits import greedy_parity, logit_rounding, logit_rounding_capture, ulp_steps
from workbench.capture import CaptureWriter, open_capture
from workbench.errors import KernelArgumentError, WorkbenchError
from workbench.numerics.dtypes import round_to
from workbench.numerics.metrics import compare
from pathlib import Path

CAPTURES = Path(__file__).resolve().parents[2] / "captures"
HI, LO = 11.14099662, 11.11763134  # both round to bf16 11.125


def tie_logits(V=1000, dtype=torch.float64):
    v = torch.linspace(-4.0, 3.0, V, dtype=torch.float64)
    v[67], v[692] = LO, HI
    return v.to(dtype)


def test_bf16_tie_picks_lower_index_and_regret_in_nats():
    ds = logit_rounding(tie_logits(), regret_limit=0.05).isel(row=0)
    assert list(ds.token.values[:2]) == [692, 67]
    assert ds.value.sel(dtype="bf16").values[:2].tolist() == [11.125, 11.125]
    assert ds.value.sel(dtype="fp64").values[:2].tolist() == [HI, LO]
    assert ds.tied.values[:2].all() and not ds.tied.values[2:].any()
    assert int(ds.n_tied) == 2 and bool(ds.tie)
    assert int(ds.chosen) == 67 and int(ds.chosen_fp64) == 692 and bool(ds.flipped)
    assert int(ds.margin_ulp) == 0
    assert float(ds.margin_fp64) == pytest.approx(HI - LO, abs=1e-12)
    assert float(ds.margin_fp64_ulp) == pytest.approx((HI - LO) / 0.0625)  # bf16 ULP at 11.x is 2^-4
    assert float(ds.regret) == pytest.approx(0.02336528, abs=1e-8)
    assert bool(ds.regret_pass)
    assert not bool(logit_rounding(tie_logits(), regret_limit=0.01).regret_pass[0])


def test_no_tie_in_fp32_and_margin_counts_representable_values():
    ds = logit_rounding(tie_logits(), dtype="fp32").isel(row=0)
    assert int(ds.chosen) == 692 and not bool(ds.tie) and float(ds.regret) == 0.0
    a, b = round_to([LO, HI], "fp32")
    assert int(ds.margin_ulp) == int(ulp_steps(a, b, "fp32")) > 0


def test_hidden_times_weight_matches_logits_route():
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(3, 16, generator=g).bfloat16(), torch.randn(50, 16, generator=g).bfloat16()
    a = logit_rounding(hidden=h, weight=w)
    b = logit_rounding(h.double() @ w.double().T)
    for v in ("chosen", "chosen_fp64", "margin_ulp", "regret", "token", "value"):
        np.testing.assert_array_equal(a[v].values, b[v].values)
    assert "FP64 product" in a.attrs["source"]


def test_golden_logits_set_the_regret():
    v = tie_logits()
    golden = v.clone()
    golden[67] += 1.0  # the golden model prefers 67 after all
    ds = logit_rounding(v, golden=golden).isel(row=0)
    assert float(ds.regret) == 0.0 and ds.attrs["golden"].startswith("golden")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=2, max_size=40))
def test_ulp_steps_agrees_with_compare(xs):
    a = torch.tensor(xs, dtype=torch.float32).bfloat16()
    b = torch.roll(a, 1)
    steps = np.abs(ulp_steps(a.double().numpy(), b.double().numpy(), "bf16"))
    assert int(steps.max()) == compare(a, b, dtype="bf16").max_ulp


def test_every_tied_token_is_reported_beyond_top():
    v = torch.zeros(40, dtype=torch.float64)
    v[[3, 9, 17, 30]] = torch.tensor([8.01, 8.02, 8.03, 8.0], dtype=torch.float64)  # all round to bf16 8.0
    ds = logit_rounding(v, top=2).isel(row=0)
    assert int(ds.n_tied) == 4 and ds.sizes["k"] == 4
    assert sorted(ds.token.values[ds.tied.values].tolist()) == [3, 9, 17, 30] and int(ds.chosen) == 3


def test_argument_errors_name_the_argument():
    with pytest.raises(KernelArgumentError, match="either logits= or hidden="):
        logit_rounding()
    with pytest.raises(KernelArgumentError) as e:
        logit_rounding(hidden=torch.randn(2, 8), weight=torch.randn(8, 5))
    assert e.value.key == "weight" and e.value.fix
    with pytest.raises(KernelArgumentError, match="golden"):
        logit_rounding(torch.randn(2, 5), golden=torch.randn(3, 5))
    with pytest.raises(KernelArgumentError):
        logit_rounding(torch.arange(5))
    with pytest.raises(KernelArgumentError):
        logit_rounding(torch.randn(5), top=0)


def write_arm(path, *, tie_step=1, flip_step=None, V=1000, D=8, steps=4):
    """A synthetic run: lm_head input one-hot e_step, weight column step = that step's logits."""
    w = torch.zeros(V, D)
    with CaptureWriter(path, arm=path.name, run={"expect": {"bf16_tie": {"step": tie_step, "chosen": 67,
                                                                         "tokens": [67, 692]}}}) as cw:
        base = torch.linspace(-4.0, 3.0, V, dtype=torch.float64)
        for s in range(steps):
            v = base.clone()
            if s == tie_step:
                v[67], v[692] = LO, HI
            elif s == flip_step:
                v[5] = 10.0
            else:
                v[s + 10] = 9.0
            w[:, s] = v.float()  # step s reads weight column s: one weight serves every step
            h = torch.zeros(1, 1, D)
            h[..., s] = 1.0
            cw.add(h, step=s, op="lm_head", name="input")
            cw.add(v.float().reshape(1, 1, V), step=s, op="sampler", name="input")
            cw.add(v.float().reshape(1, 1, V).argmax(-1)[:, 0], step=s, op="sampler", name="output")
        cw.add(w.clone(), step=0, op="lm_head", name="weight")
    return path


def test_capture_routes_find_the_planted_tie(tmp_path):
    cap = open_capture(write_arm(tmp_path / "control"))
    a = logit_rounding_capture(cap, op="sampler")
    b = logit_rounding_capture(cap)  # lm_head input x captured weight in FP64
    for ds in (a, b):
        assert ds.step.values.tolist() == [0, 1, 2, 3]
        assert ds.tie.values.tolist() == [False, True, False, False]
        assert int(ds.chosen.sel(row=1)) == 67 and int(ds.chosen_fp64.sel(row=1)) == 692
    assert a.attrs["op"] == "sampler" and b.attrs["capture"] == str(cap.path)
    with pytest.raises(WorkbenchError, match="weight"):
        logit_rounding_capture(cap, weight_name="nope")


def test_greedy_parity_on_captures_and_tensors(tmp_path):
    a = write_arm(tmp_path / "control")
    b = write_arm(tmp_path / "candidate", flip_step=2)
    ds = greedy_parity(a, b)
    assert ds.same.values.tolist() == [True, True, False, True]
    assert ds.attrs["first_mismatch"] == 2 and ds.attrs["n_same"] == 3
    assert ds.tie.sel(arm="control").values.tolist() == [False, True, False, False]
    assert int(ds.token.sel(step=1, arm="candidate")) == 67
    t = greedy_parity(torch.tensor([[1.0, 2.0], [3.0, 1.0]]), [torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0])])
    assert t.same.values.tolist() == [True, False]
    with pytest.raises(KernelArgumentError):
        greedy_parity(torch.randn(3, 5), torch.randn(2, 5))


def test_bundled_control_fp32_choice_is_the_captured_token():
    """The bundled control samples greedily over bf16 logits: the analysis agrees at every step."""
    cap = open_capture(CAPTURES / "control")
    ds = logit_rounding_capture(cap, op="lm_head", name="logits")
    tokens = [int(cap.get(op="sampler", name="token", step=int(s)).reshape(-1)[0]) for s in ds.step.values]
    assert ds.chosen.values.tolist() == tokens
    parity = greedy_parity(cap, cap, op="lm_head", name="logits")
    assert parity.same.all()


def test_bundled_tie_capture_planted_answer():
    """tie-control plants FP64 logits 11.117631 (67) and 11.140996 (692) that both round to bf16
    11.125. With the model's own lm_head weight (rebuilt, not read from metadata) the analysis
    finds the tie, greedy's pick by index, the FP64 winner and the regret in nats."""
    from workbench.models.hybrid import ArmConfig
    from workbench.models.sample import tie_model

    cap = open_capture(CAPTURES / "tie-control")
    model, _ = tie_model(ArmConfig(name="tie-control"))
    ds = logit_rounding_capture(cap, weight=model.weights["lm_head"], op="lm_head", name="input", step=0)
    r = ds.isel(row=0)
    assert bool(r.tie)
    assert sorted(int(t) for t in r.token.values[r.tied.values]) == [67, 692]
    assert int(r.chosen) == 67 and int(r.chosen_fp64) == 692
    assert float(r.value.sel(dtype="bf16").max()) == 11.125
    assert float(r.regret) == pytest.approx(11.140996 - 11.117631, abs=2e-5)  # 0.0234 nats lost
    assert int(cap.get(op="sampler", name="token", step=0).reshape(-1)[0]) == 67
    cand = open_capture(CAPTURES / "tie-candidate")
    assert int(cand.get(op="sampler", name="token", step=0).reshape(-1)[0]) == 692


def test_docstring_examples_run():
    import doctest

    import workbench.analysis.logits as mod

    res = doctest.testmod(mod, extraglobs={"torch": torch} if hasattr(mod, "torch") else {}, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0
