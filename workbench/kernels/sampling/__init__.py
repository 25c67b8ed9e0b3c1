"""Logits and sampling: greedy with the first-maximum rule, stateless inverse-CDF draws, fp64
softmax / log-softmax. Plain torch only (these are analysis tools, not fast kernels)."""

from workbench.kernels.sampling.api import draw_intervals, greedy, log_softmax, softmax, stateless_draw

__all__ = ["greedy", "stateless_draw", "draw_intervals", "softmax", "log_softmax"]
