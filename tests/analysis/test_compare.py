import json

import numpy as np
import pytest
import torch

from workbench.analysis.compare import Rule, compare_captures
from workbench.capture import CaptureWriter, open_capture
from workbench.errors import WorkbenchError


def run(path, *, noise=0.0, bad_layer=None, seed=0, drop=None, reshape=None, nan_layer=None, dtype_layer=None):
    """A toy 2-step, 4-layer run; the candidate options plant one known defect."""
    g = torch.Generator().manual_seed(seed)
    with CaptureWriter(path, arm=path.name) as w:
        x = torch.randn(64, generator=torch.Generator().manual_seed(1))
        for step in range(2):
            for layer in range(4):
                x = torch.tanh(1.1 * x + 0.1)
                if noise:
                    x = x + noise * torch.randn(64, generator=g)
                if layer == bad_layer and step == 0:
                    x = x.bfloat16().float()
                out = x
                if (layer, step) == nan_layer:
                    out = x.clone(); out[5] = float("nan")
                if (layer, step) == reshape:
                    out = x.view(8, 8)
                if (layer, step) == dtype_layer:
                    out = x.double()
                if (layer, step) != drop:
                    w.add(out, step=step, layer=layer, op="mlp", name="output")
                w.add(torch.tensor(float(layer)), step=step, layer=layer, op="mlp", name="id")
    return path


@pytest.fixture
def arms(tmp_path):
    return dict(
        control=run(tmp_path / "control"),
        aa=run(tmp_path / "aa", noise=1e-7, seed=3),
        cand=run(tmp_path / "cand", noise=1e-7, bad_layer=2, seed=4),
    )


def test_first_divergence_with_aa_noise(arms):
    r = compare_captures(arms["control"], arms["cand"], aa=arms["aa"])
    fd = r.first_divergence()
    assert (fd["step"], fd["layer"], fd["op"], fd["name"]) == (0, 2, "mlp", "output")
    assert fd["status"] == "diverged" and fd["value"] > fd["threshold"] == pytest.approx(4 * fd["aa"])
    # layers before it carry only noise comparable to the A/A repeat
    before = r.table[(r.table["seq"] < fd["seq"]) & (r.table["name"] == "output")]
    assert len(before) == 2 and not before["exceeded"].any()
    assert "first divergence: rank=0 step=0 layer=2 op=mlp name=output" in r.report()


def test_without_aa_uses_rule_thresholds(arms):
    r = compare_captures(arms["control"], arms["aa"])
    assert r.first_divergence() is None  # 1e-7 noise is below the default rel_l2 1e-3
    r = compare_captures(arms["control"], arms["aa"], rules=[Rule("mlp/output", threshold=1e-9)])
    assert r.first_divergence()["layer"] == 0
    r = compare_captures(arms["control"], arms["aa"], rules={"pattern": "layer0/*", "metric": "max_abs",
                                                             "threshold": 1e-9})
    assert r.first_divergence()["layer"] == 0 and r.first_divergence()["metric"] == "max_abs"


def test_identical_runs_never_diverge(arms):
    r = compare_captures(arms["control"], arms["control"], aa=arms["control"])
    assert r.first_divergence() is None and set(r.table["status"]) == {"ok"}
    assert (r.table["n_diff"] == 0).all()


def test_structural_mismatches_are_rows_not_crashes(arms, tmp_path):
    cand = run(tmp_path / "odd", drop=(1, 0), reshape=(3, 0), nan_layer=(2, 1), dtype_layer=(0, 1))
    r = compare_captures(arms["control"], cand)
    st = r.table.set_index(["step", "layer", "name"])["status"]
    assert st[(0, 1, "output")] == "only_control"
    assert st[(0, 3, "output")] == "shape_mismatch"
    assert st[(1, 2, "output")] == "nonfinite"
    assert st[(1, 0, "output")] == "dtype_mismatch"
    fd = r.first_divergence()
    assert (fd["step"], fd["layer"]) == (0, 3)  # missing keys do not count by default
    assert (r.first_divergence(include_missing=True)["layer"]) == 1
    assert len(r.only_control) == 1 and len(r.only_candidate) == 0
    reverse = compare_captures(cand, arms["control"])
    assert len(reverse.only_candidate) == 1 and reverse.table["status"].iloc[-1] == "only_candidate"


def test_views_and_json(arms):
    r = compare_captures(arms["control"], arms["cand"], aa=arms["aa"], op="mlp", name="output")
    ds = r.to_xarray()
    assert ds.sizes["key"] == 8 and set(ds["layer"].values) == {0, 1, 2, 3}
    assert json.loads(ds.attrs["rules"]) == []
    d = json.loads(json.dumps(r.to_dict()))
    assert d["first_divergence"]["layer"] == 2 and len(d["rows"]) == 8


def test_bad_rules():
    with pytest.raises(WorkbenchError, match="Rule.metric must be one of"):
        Rule(metric="cosine")
    with pytest.raises(WorkbenchError, match="bad rule"):
        compare_captures("unused", "unused", rules=[{"pattern": "*", "thresh": 1}])


def _one(path, t, op="o", name="x"):
    with CaptureWriter(path, arm=path.name) as w:
        w.add(t, op=op, name=name)
    return path


def test_zero_reference_is_judged_by_absolute_difference(tmp_path):
    ctl = _one(tmp_path / "ctl", torch.zeros(16))
    rep = _one(tmp_path / "rep", torch.full((16,), 1e-9))
    far = _one(tmp_path / "far", torch.full((16,), 1e6))
    near = _one(tmp_path / "near", torch.full((16,), 2e-9))
    row = compare_captures(ctl, far, aa=rep).table.iloc[0]
    assert row["metric"] == "max_abs" and np.isfinite(row["threshold"]) and row["status"] == "diverged"
    assert row["threshold"] == pytest.approx(4e-9, rel=1e-6)  # 4 x the repeat's max |difference|
    assert compare_captures(ctl, near, aa=rep).first_divergence() is None  # within the A/A noise


def test_integers_are_compared_exactly(tmp_path):
    a = _one(tmp_path / "a", torch.tensor([2**53, 7], dtype=torch.int64))
    b = _one(tmp_path / "b", torch.tensor([2**53 + 1, 7], dtype=torch.int64))
    fd = compare_captures(a, b).first_divergence()
    assert fd is not None and fd["metric"] == "max_ulp" and fd["max_ulp"] == 1 and fd["n_diff"] == 1
    assert compare_captures(a, a).first_divergence() is None
    # a rule of the user's own still decides
    assert compare_captures(a, b, rules=[Rule("o/*", "max_ulp", 1.0)]).first_divergence() is None


def test_missing_keys_are_findings(tmp_path):
    a = _one(tmp_path / "a", torch.ones(2))
    b = _one(tmp_path / "b", torch.ones(2), op="p")
    res = compare_captures(a, b)
    assert not res.same_keys and res.first_divergence() is None
    lines = res.describe_missing()
    assert lines[0].startswith("1 key(s) only in the control") and "op=o" in lines[0]
    assert lines[1].startswith("1 key(s) only in the candidate") and "op=p" in lines[1]
    assert "only in the control" in res.report() and res.to_dict()["same_keys"] is False


@pytest.mark.parametrize("field, value", [("threshold", float("nan")), ("threshold", float("inf")),
                                          ("aa_factor", float("nan")), ("floor", -1.0)])
def test_rules_refuse_non_finite_or_negative_thresholds(field, value):
    with pytest.raises(WorkbenchError, match=f"Rule.{field} must be a finite number"):
        Rule("*", **{field: value})


def _ulp_up(t):
    """t with its first element moved one fp32 ULP up (a one-bit change)."""
    u = t.clone()
    u.view(torch.int32)[0] += 1
    return u


def test_zero_noise_key_diverges_at_one_ulp(tmp_path):
    # the A/A repeat is bitwise equal (zero noise): the threshold is max(4 * 0, floor=0) = 0, so
    # a one-ULP change diverges (it must not fall back to the rule's 1e-3 default)
    x = torch.linspace(1, 2, 64)
    ctl, rep, cand = _one(tmp_path / "c", x), _one(tmp_path / "r", x.clone()), _one(tmp_path / "d", _ulp_up(x))
    fd = compare_captures(ctl, cand, aa=rep).first_divergence()
    assert fd is not None and fd["aa"] == 0.0 and fd["threshold"] == 0.0 and 0 < fd["value"] < 1e-6
    # a floor suppresses it
    floor = Rule("*", floor=1e-6)
    assert compare_captures(ctl, cand, aa=rep, rules=[floor]).first_divergence() is None
    # without an A/A capture the rule's threshold applies, and 1e-3 hides the one-ULP change
    assert compare_captures(ctl, cand).first_divergence() is None


def test_aa_factor_sets_the_threshold(arms):
    base = compare_captures(arms["control"], arms["cand"], aa=arms["aa"]).table
    ten = compare_captures(arms["control"], arms["cand"], aa=arms["aa"], rules=[Rule("*", aa_factor=10.0)]).table
    rows = base["name"] == "output"
    np.testing.assert_allclose(base.loc[rows, "threshold"], 4.0 * base.loc[rows, "aa"])
    np.testing.assert_allclose(ten.loc[rows, "threshold"], 10.0 * ten.loc[rows, "aa"])
    # a factor so large that no key is beyond it: nothing diverges
    huge = Rule("*", aa_factor=1e9)
    assert compare_captures(arms["control"], arms["cand"], aa=arms["aa"], rules=[huge]).first_divergence() is None
