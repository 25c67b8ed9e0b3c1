from fractions import Fraction

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.errors import KernelArgumentError
from workbench.numerics.dtypes import canonical, fmt, round_to, torch_dtype, ulp_of


def exact_rne(x: float, name: str) -> float:
    """Round with exact rational arithmetic over every representable value nearby."""
    f = fmt(name)
    if x == 0:
        return x
    a = Fraction(abs(x))
    e = max(a.numerator.bit_length() - a.denominator.bit_length(), f.min_normal_exp)
    while Fraction(2) ** e > a and e > f.min_normal_exp:
        e -= 1
    while Fraction(2) ** (e + 1) <= a:
        e += 1
    q = Fraction(2) ** (e - f.mantissa)
    n = a / q
    lo = n.numerator // n.denominator
    rem = n - lo
    r = lo + (1 if rem > Fraction(1, 2) or (rem == Fraction(1, 2) and lo % 2) else 0)
    v = float(r * q)
    if v > f.max_normal:
        v = float("inf")
    return v if x > 0 else -v


def test_tie_example_from_the_field():
    assert list(round_to([11.14099662, 11.11763134], "bf16")) == [11.125, 11.125]


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
       st.sampled_from(["bf16", "fp16", "fp32"]))
def test_round_to_is_exact_rne(x, name):
    assert round_to([x], name)[0] == exact_rne(x, name)


def test_round_to_handles_ties_subnormals_and_overflow():
    one_ulp = 2.0**-7
    assert round_to([1 + one_ulp / 2], "bf16")[0] == 1.0              # tie to even (down)
    assert round_to([1 + 1.5 * one_ulp], "bf16")[0] == 1 + 2 * one_ulp  # tie to even (up)
    assert round_to([65520.0], "fp16")[0] == np.inf
    assert round_to([65519.0], "fp16")[0] == 65504.0
    assert round_to([2.0**-25], "fp16")[0] == 0.0                      # half the min subnormal: to even (0)
    assert round_to([3 * 2.0**-25], "fp16")[0] == 2.0**-23
    assert np.isnan(round_to([np.nan], "bf16")[0])


def test_round_to_agrees_with_torch_when_no_double_rounding():
    x = torch.randn(10_000, dtype=torch.float32).double()  # fp32-exact: torch rounds once
    for name, td in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        np.testing.assert_array_equal(round_to(x, name), x.float().to(td).double().numpy())


def test_names_and_ulp():
    assert canonical(torch.bfloat16) == "bf16" and canonical("float32") == "fp32"
    assert torch_dtype("half") is torch.float16
    assert list(ulp_of([1.0, 11.125], "bf16")) == [2.0**-7, 2.0**-4]
    with pytest.raises(KernelArgumentError, match="unknown floating-point format"):
        canonical("fp12")
