"""Analyses: each answers one question an engineer asks about a divergence."""

from workbench.analysis.compare import DEFAULT_RULE, ComparisonResult, Rule, compare_captures

__all__ = ["DEFAULT_RULE", "ComparisonResult", "Rule", "compare_captures"]
from workbench.analysis.logits import captured_logits, greedy_parity, logit_rounding, logit_rounding_capture
from workbench.analysis.sampling import flip_at, sampling_flips
from workbench.analysis.splitk import splitk_findings, splitk_sweep, splitk_sweep_capture
from workbench.analysis.stats import (
    aa_comparison, abba_blocks, mcnemar_exact, newcombe_paired_ci, paired_binary, paired_binary_table, paired_timing,
)

__all__ += [
    "captured_logits", "greedy_parity", "logit_rounding", "logit_rounding_capture",
    "flip_at", "sampling_flips",
    "splitk_findings", "splitk_sweep", "splitk_sweep_capture",
    "aa_comparison", "abba_blocks", "mcnemar_exact", "newcombe_paired_ci", "paired_binary", "paired_binary_table",
    "paired_timing",
]
