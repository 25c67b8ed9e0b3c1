"""Kernel families (gdn, qsa, gemm, sampling) and the backend registry."""

from workbench.kernels.registry import backends, get_backend, register_backend

__all__ = ["backends", "get_backend", "register_backend"]
