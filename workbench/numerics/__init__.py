"""Numerics: formats and exact rounding, ULP, the comparison primitive, the numerics policy."""

from workbench.numerics.dtypes import FORMATS, FloatFormat, canonical, round_to, torch_dtype, ulp_of
from workbench.numerics.policy import DEFAULT, Policy, current_policy, resolve_policy, use_policy

__all__ = [
    "FORMATS", "FloatFormat", "canonical", "round_to", "torch_dtype", "ulp_of",
    "DEFAULT", "Policy", "current_policy", "resolve_policy", "use_policy",
]
