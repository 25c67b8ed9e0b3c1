import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from workbench.analysis.sampling import flip_at, sampling_flips
from workbench.errors import KernelArgumentError
from workbench.kernels.sampling import stateless_draw

EOS_A, EOS_B = [0.760651, 0.239349], [0.839734, 0.160266]  # token 0 = EOS, token 1 = newline


def test_eos_example_flips_every_u_in_between():
    ds = sampling_flips(EOS_A, EOS_B, u=[0.5, 0.760651, 0.8, 0.839734, 0.9])
    assert ds.attrs["total_width"] == pytest.approx(0.079083, abs=1e-12)
    assert ds.attrs["n_intervals"] == 1
    assert float(ds.lo[0]) == pytest.approx(0.760651, abs=1e-15) and float(ds.hi[0]) == pytest.approx(0.839734, abs=1e-15)
    assert int(ds.token_control[0]) == 1 and int(ds.token_candidate[0]) == 0  # newline -> EOS
    assert ds.flipped_at_u.values.tolist() == [False, True, True, False, False]  # half-open [lo, hi)
    assert flip_at(EOS_A, EOS_B, 0.8) == (np.array([1]), np.array([0]))


def test_descending_order_and_identical_arms():
    ds = sampling_flips([0.3, 0.7], [0.3, 0.7], order="descending")
    assert ds.sizes["interval"] == 0 and ds.attrs["total_width"] == 0.0
    # descending: token 1 first; the arms swap ranks, so most draws flip
    ds = sampling_flips([0.4, 0.6], [0.6, 0.4], order="descending")
    assert ds.attrs["total_width"] == pytest.approx(1.0)


probs = st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=2, max_size=12).filter(lambda p: sum(p) > 1e-3)


@settings(max_examples=40, deadline=None)
@given(probs, st.data(), st.sampled_from(["index", "descending", "perm"]))
def test_intervals_match_stateless_draw(pa, data, order):
    V = len(pa)
    pb = data.draw(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=V, max_size=V).filter(lambda p: sum(p) > 1e-3))
    if order == "perm":
        order = torch.tensor(data.draw(st.permutations(range(V))))
    a, b = torch.tensor(pa, dtype=torch.float64), torch.tensor(pb, dtype=torch.float64)
    ds = sampling_flips(a, b, order=order)
    lo, hi = ds.lo.values, ds.hi.values
    assert (hi > lo).all() and (lo[1:] >= hi[:-1]).all()
    # inside each interval (its ends and middle) the arms differ, and by the reported tokens
    for l, h, ta, tb in zip(lo, hi, ds.token_control.values, ds.token_candidate.values):
        for u in {l, min((l + h) / 2, np.nextafter(h, 0.0))}:  # tiny intervals: stay below hi
            assert stateless_draw(a, float(u), order=order).item() == ta
            assert stateless_draw(b, float(u), order=order).item() == tb
    # outside the intervals they agree: check random draws against the intervals
    us = np.random.default_rng(0).random(24)
    inside = ((us[:, None] >= lo) & (us[:, None] < hi)).any(1)
    ra = np.array([stateless_draw(a, float(u), order=order).item() for u in us])
    rb = np.array([stateless_draw(b, float(u), order=order).item() for u in us])
    np.testing.assert_array_equal(ra != rb, inside)
    np.testing.assert_array_equal(flip_at(a, b, us, order=order), (ra, rb))
    # a shared-u coupling flips at least as often as the total variation distance
    tv = 0.5 * (a / a.sum() - b / b.sum()).abs().sum().item()
    assert ds.attrs["total_width"] >= tv - 1e-12


def test_large_vocabulary_is_fast_enough():
    g = torch.Generator().manual_seed(0)
    V = 151936
    la = torch.randn(V, generator=g, dtype=torch.float64) * 3
    a = torch.softmax(la, 0)
    b = torch.softmax(la + 0.01 * torch.randn(V, generator=g, dtype=torch.float64), 0)
    ds = sampling_flips(a, b, order="descending", u=np.linspace(0, 0.999, 1000))
    assert 0 < ds.attrs["total_width"] <= 1 and ds.sizes["draw"] == 1000
    inside = ((ds.u.values[:, None] >= ds.lo.values) & (ds.u.values[:, None] < ds.hi.values)).any(1)
    np.testing.assert_array_equal(ds.flipped_at_u.values, inside)


def test_argument_errors():
    with pytest.raises(KernelArgumentError, match="p_candidate"):
        sampling_flips([0.5, 0.5], [0.2, 0.3, 0.5])
    with pytest.raises(KernelArgumentError):
        sampling_flips(torch.ones(2, 3), torch.ones(2, 3))
    with pytest.raises(KernelArgumentError, match="u"):
        flip_at(EOS_A, EOS_B, 1.0)
    with pytest.raises(KernelArgumentError):
        sampling_flips([-0.1, 1.1], EOS_B)


def test_docstring_examples_run():
    import doctest

    import workbench.analysis.sampling as mod

    res = doctest.testmod(mod, extraglobs={"torch": torch} if hasattr(mod, "torch") else {}, optionflags=doctest.ELLIPSIS)
    assert res.failed == 0 and res.attempted > 0
