"""Analyses: each answers one question an engineer asks about a divergence."""

from workbench.analysis.compare import DEFAULT_RULE, ComparisonResult, Rule, compare_captures

__all__ = ["DEFAULT_RULE", "ComparisonResult", "Rule", "compare_captures"]
from workbench.analysis.logits import captured_logits, greedy_parity, logit_rounding, logit_rounding_capture, logit_ties
from workbench.analysis.sampling import flip_at, sampling_flips, sampling_flips_captures
from workbench.analysis.splitk import splitk_explain, splitk_findings, splitk_sweep, splitk_sweep_capture
from workbench.analysis.stats import (
    aa_comparison, abba_blocks, exact_conditional_paired_ci, match_interval, mcnemar_exact, newcombe_paired_ci,
    paired_binary, paired_binary_table, paired_intervals, paired_timing, tango_paired_ci, wald_paired_ci,
)

__all__ += [
    "captured_logits", "greedy_parity", "logit_rounding", "logit_rounding_capture", "logit_ties",
    "flip_at", "sampling_flips", "sampling_flips_captures",
    "splitk_explain", "splitk_findings", "splitk_sweep", "splitk_sweep_capture",
    "aa_comparison", "abba_blocks", "exact_conditional_paired_ci", "match_interval", "mcnemar_exact", "newcombe_paired_ci",
    "paired_binary", "paired_binary_table", "paired_intervals", "paired_timing", "tango_paired_ci", "wald_paired_ci",
]
from workbench.analysis.divergence import bisect, graft, key_of
from workbench.analysis.relocation import relocation_invariance, relocation_invariance_captures
from workbench.analysis.replay import OpAdapter, adapters, counterfactuals, describe_counterfactuals, register_adapter, replay
from workbench.analysis.state import chunked_continuation, prefill_decode_handoff, state_drift, state_evolution
from workbench.analysis import accessors as _accessors  # noqa: F401  registers ds.div

__all__ += [
    "bisect", "graft", "key_of",
    "relocation_invariance", "relocation_invariance_captures", "OpAdapter", "adapters", "counterfactuals", "describe_counterfactuals",
    "register_adapter", "replay",
    "chunked_continuation", "prefill_decode_handoff", "state_drift", "state_evolution",
]
