"""Kernel families (gdn, qsa, gemm, sampling) and the backend registry."""

from workbench.kernels.registry import backends, fallbacks, get_backend, get_op, register_backend

__all__ = ["backends", "fallbacks", "get_backend", "get_op", "register_backend"]
