"""Logits and sampling: greedy with the first-maximum rule, stateless inverse-CDF draws, fp64
softmax / log-softmax. Plain torch only (these are analysis tools, not fast kernels)."""

from workbench.kernels.registry import register_backend
from workbench.kernels.sampling.api import draw_intervals, greedy, log_softmax, softmax, stateless_draw

# one backend: the family is listed by `backends("sampling")` like the others
register_backend("sampling", "torch", "workbench.kernels.sampling.api",
                 description="plain torch, fp64 where it matters (analysis tools with every tie and order rule "
                             "stated; not fast kernels)")

__all__ = ["greedy", "stateless_draw", "draw_intervals", "softmax", "log_softmax"]
