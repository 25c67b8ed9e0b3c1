import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import KernelArgumentError
from workbench.numerics.metrics import compare

_INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
        torch.float16: torch.int16}


def ordered(t: torch.Tensor) -> np.ndarray:
    bits = t.view(_INT[t.dtype]).numpy().astype(np.int64)
    nbits = t.element_size() * 8
    if nbits == 16:
        bits = bits & 0xFFFF
    sign = np.int64(1) << (nbits - 1)
    mag = bits & (sign - 1) if nbits < 64 else bits & np.int64(0x7FFFFFFFFFFFFFFF)
    neg = (bits & sign) != 0 if nbits < 64 else bits < 0
    return np.where(neg, -mag, mag)


def reference(a: torch.Tensor, b: torch.Tensor, atol, rtol):
    with np.errstate(all="ignore"):
        return _reference(a, b, atol, rtol)


def _reference(a, b, atol, rtol):
    x = a.double().numpy().ravel()
    y = b.double().numpy().ravel()
    fin = np.isfinite(x) & np.isfinite(y)
    d = np.abs(y - x)[fin]
    ua = ordered(a.contiguous().view(-1))[fin]
    ub = ordered(b.contiguous().view(-1))[fin]
    u = np.abs(ua - ub)
    ne = ~((x == y) | (np.isnan(x) & np.isnan(y)))
    return dict(
        rel_l2=math.sqrt((d**2).sum() / (x[fin] ** 2).sum()),
        max_abs=d.max(initial=0.0),
        mean_abs=d.mean() if d.size else 0.0,
        cosine=(x[fin] * y[fin]).sum() / math.sqrt((x[fin] ** 2).sum() * (y[fin] ** 2).sum()),
        max_ulp=int(u.max(initial=0)),
        median_ulp=float(np.median(u[u >= 0])) if u.size else 0.0,
        n_diff=int(ne.sum()),
        frac_outside=float(((np.abs(y - x) > atol + rtol * np.abs(x)) & fin | (ne & ~fin)).sum()) / x.size,
        nan_a=int(np.isnan(x).sum()), nan_b=int(np.isnan(y).sum()),
        inf_a=int(np.isinf(x).sum()), inf_b=int(np.isinf(y).sum()),
    )


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp64", "fp32", "bf16", "fp16"])
@pytest.mark.parametrize("n", [1, 7, 70_001], ids=lambda n: f"n{n}")
def test_compare_matches_float64_reference(dtype, n):
    g = torch.Generator().manual_seed(n)
    a = torch.randn(n, generator=g, dtype=torch.float64)
    b = a + 1e-3 * torch.randn(n, generator=g, dtype=torch.float64)
    a, b = a.to(dtype), b.to(dtype)
    if n > 10:
        a[3] = float("nan"); b[3] = float("nan")
        a[5] = float("inf"); b[6] = float("-inf"); b[9] = float("nan")
    c = compare(a, b, atol=1e-4, rtol=1e-3)
    ref = reference(a, b, 1e-4, 1e-3)
    for k in ("rel_l2", "max_abs", "mean_abs", "cosine"):
        assert getattr(c, k) == pytest.approx(ref[k], rel=1e-9, abs=1e-300), k
    for k in ("max_ulp", "n_diff", "nan_a", "nan_b", "inf_a", "inf_b"):
        assert getattr(c, k) == ref[k], k
    assert c.frac_outside == pytest.approx(ref["frac_outside"])
    if ref["median_ulp"] < 256:
        # exact median of integer ULP distances (lower median for even counts)
        u = np.sort(np.abs(ordered(a.view(-1)) - ordered(b.view(-1)))[np.isfinite(a.double().numpy()) & np.isfinite(b.double().numpy())])
        assert c.median_ulp == u[(len(u) + 1) // 2 - 1]
    if n > 10:
        assert c.n_nonfinite_mismatch == 3  # inf vs finite, finite vs -inf, finite vs nan


def test_max_abs_location_and_line_format():
    a = torch.zeros(3, 4)
    b = a.clone()
    b[2, 1] = 0.5
    c = compare(a, b)
    assert c.max_abs == 0.5 and c.max_abs_index == (2, 1)
    assert c.rel_l2 == math.inf and c.n_diff == 1
    line = str(c)
    assert "max_abs=5.000e-01@[2, 1]" in line and "diff=1/12" in line


def test_identical_tensors_are_bitwise_equal():
    a = torch.randn(1000).bfloat16()
    c = compare(a, a.clone())
    assert c.bitwise_equal and c.rel_l2 == 0 and c.sqnr_db == math.inf and c.max_ulp == 0


def test_ulp_counted_in_requested_format():
    a = torch.tensor([1.0, 2.0])
    b = torch.tensor([1.0 + 2**-7, 2.0])  # one bf16 ulp at 1.0
    assert compare(a, b, dtype="bf16").max_ulp == 1
    assert compare(a, b, dtype="fp32").max_ulp == 2**16
    # mixed storage: fp32 vs bf16 counts in the coarser format by default
    assert compare(a, b.bfloat16()).dtype == "bf16"


def test_chunked_conversion_equals_single_pass():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(10_000, generator=g)
    b = (a + 1e-2 * torch.randn(10_000, generator=g)).bfloat16()
    one = compare(a, b, chunk=1 << 30)
    many = compare(a, b, chunk=999)
    d1, d2 = one.to_dict(), many.to_dict()
    for k, v in d1.items():
        if isinstance(v, float):
            assert d2[k] == pytest.approx(v, rel=1e-12), k  # sums reassociate across chunks
        else:
            assert d2[k] == v, k


def test_shape_mismatch_is_a_typed_error():
    with pytest.raises(KernelArgumentError, match=r"shapes differ"):
        compare(torch.zeros(3), torch.zeros(4))


def test_empty_tensors():
    c = compare(torch.zeros(0), torch.zeros(0))
    assert c.numel == 0 and c.rel_l2 == 0 and c.bitwise_equal


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(width=32, allow_nan=True), st.floats(width=32, allow_nan=True)),
                min_size=1, max_size=40))
def test_counts_property(pairs):
    a = torch.tensor([p[0] for p in pairs], dtype=torch.float32)
    b = torch.tensor([p[1] for p in pairs], dtype=torch.float32)
    c = compare(a, b)
    ref = reference(a, b, 1e-5, 1e-3)
    for k in ("n_diff", "nan_a", "nan_b", "inf_a", "inf_b", "max_ulp"):
        assert getattr(c, k) == ref[k]
    assert 0.0 <= c.frac_outside <= 1.0


# The kernel works in sub-blocks of metrics._SUB elements: bit-identical sub-blocks take a one-sum
# path, all-finite ones a vectorised path (ULP pass only where they differ, argmax rescan only
# where the sub-block's maximum beats the running one), and sub-blocks holding a NaN/Inf are redone
# element by element. These tests place the interesting elements across sub-block boundaries.

from workbench.numerics import metrics as _metrics  # noqa: E402

_SUB = _metrics._SUB


def ulp_distance(a, b):
    """Exact |ordered(a) - ordered(b)| as uint64 (fp64 distances across signs exceed int64)."""
    ua = ordered(a.contiguous().view(-1))
    ub = ordered(b.contiguous().view(-1))
    hi, lo = np.maximum(ua, ub), np.minimum(ua, ub)
    return hi.astype(np.uint64) - lo.astype(np.uint64)  # modular: exact in [0, 2**64)


def _check_against_reference(a, b, atol=1e-4, rtol=1e-3):
    c = compare(a, b, atol=atol, rtol=rtol)
    ref = reference(a, b, atol, rtol)
    for k in ("rel_l2", "max_abs", "mean_abs", "cosine"):
        assert getattr(c, k) == pytest.approx(ref[k], rel=1e-9, abs=1e-300), k
    for k in ("n_diff", "nan_a", "nan_b", "inf_a", "inf_b"):
        assert getattr(c, k) == ref[k], k
    assert c.frac_outside * a.numel() == pytest.approx(ref["frac_outside"] * a.numel(), abs=1e-6)
    fin = np.isfinite(a.double().numpy()) & np.isfinite(b.double().numpy())
    u = np.sort(ulp_distance(a, b)[fin])
    assert c.max_ulp == int(u.max(initial=0))
    if u.size and u[(len(u) + 1) // 2 - 1] < 256:
        assert c.median_ulp == u[(len(u) + 1) // 2 - 1]
    return c


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp64", "fp32", "bf16", "fp16"])
def test_nonfinite_in_one_sub_block_among_many(dtype):
    n = 7 * _SUB + 123
    g = torch.Generator().manual_seed(1)
    a = torch.randn(n, generator=g, dtype=torch.float64)
    b = a + 1e-3 * torch.randn(n, generator=g, dtype=torch.float64)
    a, b = a.to(dtype), b.to(dtype)
    k = 3 * _SUB + 17
    a[k] = float("nan"); b[k] = float("nan")          # NaN on both sides: equal, not a mismatch
    a[k + 5] = float("inf"); b[k + 9] = float("-inf")  # two mismatches
    b[k + 11] = float("nan")                          # a third
    b[k + 20] = b[k + 20] + 50                        # the maximum sits in the careful sub-block
    c = _check_against_reference(a, b)
    assert c.n_nonfinite_mismatch == 3
    assert c.max_abs_index == (k + 20,)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16],
                         ids=["fp64", "fp32", "bf16", "fp16"])
def test_identical_sub_blocks_then_differing(dtype):
    n = 9 * _SUB + 5
    g = torch.Generator().manual_seed(2)
    a = torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    b = a.clone()
    start = 4 * _SUB + 100
    noisy = (a[start:].double() + 1e-2 * torch.randn(n - start, generator=g, dtype=torch.float64)).to(dtype)
    b[start:] = noisy
    a[2 * _SUB + 7] = float("nan"); b[2 * _SUB + 7] = float("nan")  # identical bits, non-finite
    a[_SUB + 1] = float("inf"); b[_SUB + 1] = float("inf")
    c = _check_against_reference(a, b)
    assert c.n_nonfinite_mismatch == 0 and c.nan_a == c.nan_b == 1 and c.inf_a == c.inf_b == 1
    assert c.max_abs_index[0] >= start


def test_identical_bits_fast_path_matches_reference():
    n = 5 * _SUB + 3
    a = torch.randn(n, generator=torch.Generator().manual_seed(3)).bfloat16()
    a[7] = -0.0
    b = a.clone()
    c = _check_against_reference(a, b)
    assert c.bitwise_equal and c.max_abs_index is None and c.max_ulp == 0 and c.median_ulp == 0
    # +0 vs -0: equal values, different bits (not the identical-bits path), still no difference
    b[7] = 0.0
    c = _check_against_reference(a, b)
    assert c.n_diff == 0 and c.max_ulp == 0 and c.max_abs_index is None


@pytest.mark.parametrize("threads", [1, 2])
def test_argmax_is_first_index_of_the_maximum_across_sub_blocks(threads):
    n = (1 << 20) + 6 * _SUB  # large enough for both threads and many blocks/sub-blocks
    a = torch.zeros(n)
    b = a.clone()
    b[10] = 0.25                  # a smaller maximum in an early sub-block
    b[3 * _SUB + 9] = 0.5         # ties: the first one wins
    b[3 * _SUB + 10] = 0.5
    b[5 * _SUB + 1] = 0.5
    b[n - 2] = 0.5                # a tie in the last block, on the other thread
    c = compare(a, b)
    assert c.max_abs == 0.5 and c.max_abs_index == (3 * _SUB + 9,)
    # an increasing sequence: every sub-block rescans; the first of the final ties wins
    a = torch.zeros(4 * _SUB, dtype=torch.float64)
    b = torch.arange(4 * _SUB, dtype=torch.float64) // 3
    c = compare(a, b)
    last = int(b[-1])
    assert c.max_abs == last and c.max_abs_index == (int(np.argmax(b.numpy() == last)),)


def test_tolerance_counts_only_differing_elements():
    # with a negative atol, equal elements are not "outside" (only differing ones can be)
    a = torch.randn(3 * _SUB, generator=torch.Generator().manual_seed(4))
    b = a.clone()
    b[::7] += 1e-3
    c = compare(a, b, atol=-1.0, rtol=0.0)
    assert c.frac_outside * a.numel() == pytest.approx(c.n_diff)


def test_fp64_ulp_distance_across_signs_is_exact():
    # ordered images of -2.0 and 2.0 are 2**63 apart: counted exactly, no int64 overflow
    a = torch.tensor([-2.0, 1.0], dtype=torch.float64)
    b = torch.tensor([2.0, 1.0], dtype=torch.float64)
    c = compare(a, b)
    assert c.max_ulp == 2**63
    a = torch.tensor([-1.7976931348623157e308], dtype=torch.float64)
    b = torch.tensor([1.7976931348623157e308], dtype=torch.float64)
    assert compare(a, b).max_ulp == 2 * 0x7FEFFFFFFFFFFFFF


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_ulp_buckets_above_exact_range(dtype):
    n = 3 * _SUB
    g = torch.Generator().manual_seed(5)
    a = torch.randn(n, generator=g).to(dtype)
    b = (a.float() * (1 + 0.5 * torch.rand(n, generator=g))).to(dtype)  # many ULP apart
    c = _check_against_reference(a, b)
    u = ulp_distance(a, b)
    assert c.max_ulp == int(u.max())
    med = int(np.sort(u)[(len(u) + 1) // 2 - 1])
    if med >= 256:
        lo = 1 << (med.bit_length() - 1)
        assert c.median_ulp == lo  # lower bound of the power-of-two bucket


def test_integers_compare_exactly_at_and_beyond_2_53():
    from workbench.numerics.metrics import compare as cmp

    for big in (2**53, 2**62, -2**63 + 1):
        c = cmp(torch.tensor([big, 5]), torch.tensor([big + 1, 5]))
        assert c.n_diff == 1 and c.max_ulp == 1 and c.max_abs == 1.0 and c.max_abs_index == (0,) and c.dtype == "int"
    extreme = cmp(torch.tensor([-2**63]), torch.tensor([2**63 - 1]))
    assert extreme.max_ulp == 2**64 - 1  # the exact distance, no int64 overflow
    assert cmp(np.array([True, False]), np.array([True, True])).n_diff == 1
    assert cmp(torch.arange(4), torch.arange(4)).bitwise_equal
