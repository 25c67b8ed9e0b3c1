"""Analyses: each answers one question an engineer asks about a divergence."""

from workbench.analysis.compare import DEFAULT_RULE, ComparisonResult, Rule, compare_captures

__all__ = ["DEFAULT_RULE", "ComparisonResult", "Rule", "compare_captures"]
