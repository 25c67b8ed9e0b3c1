import math

import numpy as np
import pytest
import scipy.stats
from hypothesis import given, settings, strategies as st

from workbench.analysis.stats import (
    aa_comparison, abba_blocks, mcnemar_exact, newcombe_paired_ci, paired_binary, paired_binary_table, paired_timing,
    t_quantile,
)
from workbench.errors import KernelArgumentError


def outcomes(n11, n10, n01, n00):
    a = [1] * n11 + [1] * n10 + [0] * n01 + [0] * n00
    b = [1] * n11 + [0] * n10 + [1] * n01 + [0] * n00
    return a, b


def test_52_of_64_vs_49_of_64_is_not_distinguishable():
    ds = paired_binary(*outcomes(45, 7, 4, 8))
    assert int(ds.pass_control) == 52 and int(ds.pass_candidate) == 49 and int(ds.n) == 64
    assert int(ds.control_only) == 7 and int(ds.candidate_only) == 4 and int(ds.discordant) == 11
    assert float(ds.rate_diff) == pytest.approx(-3 / 64)
    assert float(ds.p_value) == pytest.approx(scipy.stats.binomtest(7, 11, 0.5).pvalue, abs=1e-15)
    assert float(ds.ci_low) < float(ds.rate_diff) < float(ds.ci_high) and float(ds.ci_low) < 0 < float(ds.ci_high)
    assert not bool(ds.significant)
    assert ds.table.values.tolist() == [[45, 7], [4, 8]]
    assert "McNemar" in ds.attrs["test"] and "Newcombe" in ds.attrs["ci_method"]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(0, 300))
def test_mcnemar_exact_equals_scipy_binomtest(b, c):
    expect = 1.0 if b + c == 0 else scipy.stats.binomtest(b, b + c, 0.5, alternative="two-sided").pvalue
    assert mcnemar_exact(b, c) == pytest.approx(expect, rel=1e-9, abs=1e-300)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.integers(0, 40), st.integers(0, 40), st.integers(0, 40),
       st.sampled_from([0.8, 0.9, 0.95, 0.99]))
def test_newcombe_interval_is_sane(n11, n10, n01, n00, conf):
    if n11 + n10 + n01 + n00 == 0:
        return
    lo, hi = newcombe_paired_ci(n11, n10, n01, n00, confidence=conf)
    d = (n01 - n10) / (n11 + n10 + n01 + n00)
    assert -1 <= lo <= d <= hi <= 1
    lo2, hi2 = newcombe_paired_ci(n11, n01, n10, n00, confidence=conf)  # swapping arms mirrors it
    assert lo2 == pytest.approx(-hi) and hi2 == pytest.approx(-lo)
    if conf < 0.99:
        wlo, whi = newcombe_paired_ci(n11, n10, n01, n00, confidence=0.99)
        assert wlo <= lo + 1e-12 and hi <= whi + 1e-12


@pytest.mark.parametrize("p11,p10,p01,n", [(0.7, 0.1, 0.05, 64), (0.5, 0.2, 0.2, 40), (0.85, 0.05, 0.02, 100)],
                         ids=["n64", "n40-sym", "n100-rare"])
def test_newcombe_coverage_is_near_nominal(p11, p10, p01, n):
    rng = np.random.default_rng(1)
    true = p01 - p10
    tables = rng.multinomial(n, [p11, p10, p01, 1 - p11 - p10 - p01], size=1500)
    hits = sum(lo <= true <= hi for lo, hi in (newcombe_paired_ci(*map(int, t)) for t in tables))
    assert 0.92 <= hits / len(tables) <= 0.99


@settings(max_examples=50, deadline=None)
@given(st.floats(0.51, 0.9995), st.floats(1.0, 200.0))
def test_t_quantile_matches_scipy(q, df):
    assert t_quantile(q, df) == pytest.approx(scipy.stats.t.ppf(q, df), rel=1e-8, abs=1e-9)
    assert t_quantile(1 - q, df) == pytest.approx(-t_quantile(q, df))


def test_abba_blocks_and_log_t_interval_against_scipy():
    t = [1.0, 1.10, 1.12, 1.01, 0.99, 1.09, 1.11, 1.02, 1.0, 1.13, 1.08, 0.98]
    a, b = abba_blocks(t)
    assert a.shape == (3, 2) and a[0].tolist() == [1.0, 1.01] and b[0].tolist() == [1.10, 1.12]
    ds = paired_timing(a, b)
    r = np.log(b.mean(1) / a.mean(1))
    lo, hi = scipy.stats.t.interval(0.95, len(r) - 1, loc=r.mean(), scale=scipy.stats.sem(r))
    assert float(ds.ratio) == pytest.approx(math.exp(r.mean()))
    assert float(ds.ci_low) == pytest.approx(math.exp(lo)) and float(ds.ci_high) == pytest.approx(math.exp(hi))
    assert bool(ds.significant) and ds.block_ratio.dims == ("block",)


def test_bootstrap_is_reproducible_and_brackets_the_ratio():
    rng = np.random.default_rng(3)
    a = 1.0 + 0.02 * rng.standard_normal(20)
    b = 1.05 * a + 0.02 * rng.standard_normal(20)
    d1 = paired_timing(a, b, method="bootstrap", n_boot=2000, seed=7)
    d2 = paired_timing(a, b, method="bootstrap", n_boot=2000, seed=7)
    assert float(d1.ci_low) == float(d2.ci_low) and float(d1.ci_high) == float(d2.ci_high)
    assert float(d1.ci_low) < float(d1.ratio) < float(d1.ci_high)
    assert float(d1.ratio) == pytest.approx(b.mean() / a.mean())
    assert "seed=7" in d1.attrs["ci_method"]


def test_aa_noise_band_decides():
    rng = np.random.default_rng(0)
    a = 1 + 0.03 * rng.standard_normal(12)
    a2 = a * (1 + 0.03 * rng.standard_normal(12))
    small = a * (1.005 + 0.03 * rng.standard_normal(12))
    big = a * (1.2 + 0.03 * rng.standard_normal(12))
    aa = paired_timing(a, a2)
    assert not bool(aa_comparison(aa, paired_timing(a, small)).beats_noise)
    res = aa_comparison(aa, paired_timing(a, big))
    assert bool(res.beats_noise) and res.comparison.values.tolist() == ["A/A", "A/B"]
    assert float(res.noise_low) == float(aa.ci_low)
    bin_aa = paired_binary_table(50, 2, 2, 10)
    bin_ab = paired_binary_table(45, 7, 4, 8)
    r = aa_comparison(bin_aa, bin_ab)
    assert r.attrs["null"] == 0.0 and not bool(r.beats_noise)
    with pytest.raises(KernelArgumentError, match="same analysis"):
        aa_comparison(aa, bin_ab)


def test_argument_errors():
    with pytest.raises(KernelArgumentError, match="case by case"):
        paired_binary([1, 0], [1, 0, 1])
    with pytest.raises(KernelArgumentError):
        paired_binary([1, 2], [1, 0])
    with pytest.raises(KernelArgumentError):
        mcnemar_exact(-1, 3)
    with pytest.raises(KernelArgumentError, match="ABBA"):
        abba_blocks([1.0, 2.0, 3.0])
    with pytest.raises(KernelArgumentError, match="method"):
        paired_timing([1.0, 1.0], [1.0, 1.1], method="magic")
    with pytest.raises(KernelArgumentError):
        paired_timing([1.0, -1.0], [1.0, 1.1])
    with pytest.raises(KernelArgumentError, match="confidence"):
        newcombe_paired_ci(1, 2, 3, 4, confidence=95)


def test_docstring_examples_run():
    import doctest

    import workbench.analysis.stats as mod

    res = doctest.testmod(mod, extraglobs={"torch": torch} if hasattr(mod, "torch") else {}, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0


def test_read_outcomes_csv_json_and_errors(tmp_path):
    import json

    import pytest

    from workbench.analysis.stats import read_outcomes
    from workbench.errors import KernelArgumentError

    (tmp_path / "a.csv").write_text("control,candidate\npass,FAIL\n1,1\nno,yes\n")
    a, b = read_outcomes(tmp_path / "a.csv")
    assert a.tolist() == [True, True, False] and b.tolist() == [False, True, True]
    (tmp_path / "b.json").write_text(json.dumps([{"control": True, "candidate": False}]))
    assert [x.tolist() for x in read_outcomes(tmp_path / "b.json")] == [[True], [False]]
    (tmp_path / "c.csv").write_text("control,candidate\npass,maybe\n")
    with pytest.raises(KernelArgumentError, match="row 1 of column 'candidate' is 'maybe'"):
        read_outcomes(tmp_path / "c.csv")
    with pytest.raises(KernelArgumentError, match="does not exist"):
        read_outcomes(tmp_path / "none.csv")
