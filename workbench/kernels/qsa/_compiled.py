"""Plumbing shared by the compiled QSA backends (ext, numba): the policy's input and output
dtypes applied around a kernel launch that reads q/k/v as given and returns float32 o."""

from __future__ import annotations


from workbench.kernels.qsa.paged import check_decode_args, unpack_cache
from workbench.numerics.dtypes import torch_dtype

__all__ = ["decode_with_io_policy"]


def decode_with_io_policy(launch, q, kv_cache, block_table, indices, scale, num_splits, policy):
    """``launch(q, k, v, block_table, indices, scale, num_splits, policy) -> (o, lse)`` with q, k
    and v materialized in ``policy.input_dtype`` first (when set) and o rounded to
    ``policy.output_dtype`` after (when set); the arguments checked first (values on CPU only)."""
    k, v = unpack_cache(kv_cache)
    check_decode_args(q, k, v, block_table, indices, policy.num_kv_splits if num_splits is None else num_splits)
    if policy.input_dtype is not None:
        q, k, v = (t.to(torch_dtype(policy.input_dtype)) for t in (q, k, v))
    o, lse = launch(q, k, v, block_table, indices, scale, num_splits, policy)
    if policy.output_dtype is not None:
        o = o.to(torch_dtype(policy.output_dtype))
    return o, lse
