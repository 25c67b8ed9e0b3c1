"""Public QSA functions: check the arguments, then dispatch to a backend through the registry.

Backends: ``"oracle"`` (fp64 truth), ``"torch"`` (policy knobs), ``"numba"`` (numba.cuda
kernels), ``"ext"`` (native C++ on CPU tensors, CUDA on GPU tensors). Every backend module exposes
the same keyword signatures for the ops it declares in ``OPS``; asking a backend for another op
raises BackendUnavailableError listing the backends that implement it, unless ``fallback=`` names
one (the indexer and gate ops exist in ``torch`` and ``oracle`` only; the substitution is recorded
in ``workbench.kernels.fallbacks()``).
"""

from __future__ import annotations

import torch

from workbench.errors import KernelArgumentError
from workbench.kernels.qsa.paged import check_decode_args, unpack_cache
from workbench.kernels.registry import call, register_knobs
from workbench.numerics.policy import resolve_policy

__all__ = ["block_keys", "index_scores", "select", "sparse_decode", "merge_states", "output_gate"]


# the policy knobs each QSA op reads; each backend's KNOBS says which values it honours
_DECODE = ("input_dtype", "accum_dtype", "prob_dtype", "output_dtype", "partition_size", "num_kv_splits",
           "page_order")
register_knobs("qsa", {"block_keys": ("accum_dtype",), "index_scores": ("accum_dtype",), "select": (),
                       "sparse_decode": _DECODE, "merge_states": ("accum_dtype",),
                       "output_gate": ("output_dtype", "gate_round_output")})


def _tensor(name, t, ndim, shape_doc):
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise KernelArgumentError(f"{name} must be a float tensor {shape_doc}, got {type(t).__name__}"
                                  f"{'' if not isinstance(t, torch.Tensor) else ' ' + str(t.dtype)}",
                                  key=name, fix=f"pass {name} as a float tensor")
    if t.dim() != ndim:
        raise KernelArgumentError(f"{name} must be {ndim}-D {shape_doc}, got shape {tuple(t.shape)}",
                                  key=name, fix=f"reshape {name} to {shape_doc}")


def _posint(name, v):
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise KernelArgumentError(f"{name} must be a positive int, got {v!r}", key=name,
                                  fix=f"pass {name}= a positive integer")


def block_keys(k, *, ratio=4, norm=None, policy=None, backend="torch", fallback=None):
    """Indexer keys of complete blocks: the mean of ``ratio`` consecutive keys.

    Parameters
    ----------
    k: ``[B, T, D]`` indexer keys (any float dtype)
    ratio: tokens per block (= KV page size)
    norm: optional callable applied to the block keys (a normalization hook)
    policy: numerics policy (``accum_dtype`` of the mean); backend: registry name

    Returns
    -------
    ``[B, T // ratio, D]`` fp32 (fp64 for the oracle); an incomplete last block is left out.

    Example
    -------
    >>> block_keys(torch.ones(1, 9, 8)).shape
    torch.Size([1, 2, 8])
    """
    _tensor("k", k, 3, "[B, T, D]")
    _posint("ratio", ratio)
    return call("qsa", backend, "block_keys", k, ratio=ratio, norm=norm, policy=policy, fallback=fallback)


def index_scores(q_index, block_keys, *, pos, ratio=4, policy=None, backend="torch", fallback=None):
    """Indexer score of every block: ``sum_h relu(q_h . kbar_b) / sqrt(D)``.

    Parameters
    ----------
    q_index: ``[B, HI, D]`` indexer queries of the decode token (HI index heads)
    block_keys: ``[B, NB, D]`` from :func:`block_keys`
    pos: int or ``[B]`` position of the decode token (it sees tokens 0..pos); block ``b`` is
        visible when complete, ``(b + 1) * ratio <= pos + 1``; others score -inf

    Returns
    -------
    ``[B, NB]`` fp32 scores (fp64 for the oracle).

    Example
    -------
    >>> s = index_scores(torch.ones(1, 2, 4), torch.ones(1, 3, 4), pos=7)
    >>> s.tolist()
    [[4.0, 4.0, -inf]]
    """
    _tensor("q_index", q_index, 3, "[B, HI, D]")
    _tensor("block_keys", block_keys, 3, "[B, NB, D]")
    if q_index.shape[0] != block_keys.shape[0] or q_index.shape[2] != block_keys.shape[2]:
        raise KernelArgumentError(
            f"block_keys must be [B={q_index.shape[0]}, NB, D={q_index.shape[2]}] to match q_index, "
            f"got {tuple(block_keys.shape)}", key="block_keys", fix="use keys of the same batch and dim")
    return call("qsa", backend, "index_scores", q_index, block_keys, pos=pos, ratio=ratio, policy=policy,
                fallback=fallback)


def select(scores, *, budget, ratio=4, pos, seqlen=None, order="topk", backend="torch", fallback=None):
    """Token indices to attend to: top ``budget // ratio`` blocks, expanded, plus the open tail.

    Ordering rule (deterministic): ``order="topk"`` lists blocks by descending score, ties to the
    lower block index; ``order="logical"`` lists the same blocks ascending. Tokens of a block are
    ascending; the open tail of the current block (tokens ``(pos + 1) // ratio * ratio .. pos``)
    follows; tokens ``>= seqlen`` are dropped; the row is padded with -1 to ``budget + ratio - 1``.
    When no more than ``budget // ratio`` blocks are visible the selection is the whole causal
    prefix ``0 .. min(pos, seqlen - 1)`` in ascending order.

    Parameters
    ----------
    scores: ``[B, NB]`` from :func:`index_scores`
    budget: tokens selected from complete blocks (multiple of ratio), e.g. 2048
    pos: int or ``[B]``; seqlen: int, ``[B]`` or None (``pos + 1``)

    Returns
    -------
    ``[B, budget + ratio - 1]`` int32 logical token positions, -1 padded.

    Example
    -------
    >>> select(torch.tensor([[3., 1., 2.]]), budget=4, ratio=2, pos=6).tolist()
    [[0, 1, 4, 5, 6]]
    """
    _tensor("scores", scores, 2, "[B, NB]")
    _posint("budget", budget); _posint("ratio", ratio)
    if budget % ratio:
        raise KernelArgumentError(f"budget must be a multiple of ratio={ratio}, got {budget}", key="budget",
                                  fix=f"pass budget={budget // ratio * ratio or ratio}")
    if order not in ("topk", "logical"):
        raise KernelArgumentError(f"order must be one of ['topk', 'logical'], got {order!r}", key="order",
                                  fix="pass order='topk' or order='logical'")
    return call("qsa", backend, "select", scores, budget=budget, ratio=ratio, pos=pos, seqlen=seqlen, order=order,
                fallback=fallback)


def sparse_decode(q, kv_cache, block_table, indices, *, scale=None, num_splits=None, policy=None,
                  backend="torch", check=False):
    """Split-KV decode attention over the listed tokens of a paged KV cache.

    Tokens are attended in the order of ``indices``; a duplicate counts each time it is listed;
    -1 is skipped. The visit order (``policy.page_order``: list order, or ascending physical slot)
    is cut into ``num_splits`` contiguous partitions (``policy.partition_size`` tokens each when
    set); each yields a partial output and a base-2 LSE, merged by :func:`merge_states`.

    Parameters
    ----------
    q: ``[B, HQ, D]`` fp32/bf16/fp16 query of the decode token
    kv_cache: ``(k_cache, v_cache)``, each ``[num_pages, page_size, HKV, D]`` in q's dtype, or a
        :class:`PagedKVCache`; ``HQ % HKV == 0`` (GQA)
    block_table: ``[B, max_pages]`` int32 logical page -> physical page
    indices: ``[B, L]`` int32 logical token positions, -1 padded (from :func:`select`)
    scale: softmax scale, default ``D ** -0.5``
    num_splits: KV splits (default ``policy.num_kv_splits``)
    policy: numerics policy (input/accum/prob/output dtypes, partition size, page order)
    check: also validate the values of ``indices`` and ``block_table`` (tokens in range, on
        allocated pages) of CUDA tensors: a debug mode (it synchronizes, and is refused under
        CUDA-graph capture). Every backend checks shapes, dtypes and devices, and the values of
        CPU tensors, on every call; on CUDA tensors it reads no value, so that the call can be
        captured in a CUDA graph, and out-of-range values there are undefined behaviour, as in
        other engines' kernels.

    Returns
    -------
    o: ``[B, HQ, D]`` merged output, fp32 (``policy.output_dtype`` when set; fp64 for the oracle)
    lse: ``[B, HQ]`` fp32 base-2 log-sum-exp of the scaled scores, ``log2 sum_j 2^(s_j log2 e)``;
        a row with no token gives o = 0 and lse = -inf

    Example
    -------
    >>> cache = PagedKVCache.from_dense(torch.randn(1, 8, 1, 16), torch.randn(1, 8, 1, 16))
    >>> idx = torch.tensor([[0, 1, 2, 2, -1]], dtype=torch.int32)
    >>> o, lse = sparse_decode(torch.randn(1, 4, 16), cache, cache.block_table, idx, num_splits=2)
    """
    if num_splits is not None:  # before the policy takes it as a knob (a host int: free)
        _posint("num_splits", num_splits)
    k_cache, v_cache = unpack_cache(kv_cache)
    if check:  # the debug mode; the backend checks the rest itself (its own entry point)
        check_decode_args(q, k_cache, v_cache, block_table, indices,
                          resolve_policy(policy).num_kv_splits if num_splits is None else num_splits, check=True)
    return call("qsa", backend, "sparse_decode", q, (k_cache, v_cache), block_table, indices, scale=scale,
                num_splits=num_splits, policy=policy, knobs={"num_kv_splits": num_splits})


def merge_states(o_parts, lse_parts, *, policy=None, backend="torch"):
    """Merge split-KV partial states with their base-2 LSE.

    ``m = max_s lse_s``, ``w_s = 2^(lse_s - m)``, ``o = sum_s w_s o_s / sum_s w_s``,
    ``lse = m + log2 sum_s w_s``. A part with lse = -inf contributes nothing; a row whose parts are
    all empty gives o = 0 and lse = -inf.

    Parameters
    ----------
    o_parts: ``[..., S, D]`` fp32 partial outputs; lse_parts: ``[..., S]`` fp32 base-2 LSE

    Returns
    -------
    o ``[..., D]``, lse ``[...]`` (accumulator dtype; fp64 for the oracle)

    Example
    -------
    >>> o, lse = merge_states(torch.ones(1, 2, 4), torch.tensor([[0.0, float('-inf')]]))
    >>> lse.tolist()
    [0.0]
    """
    _tensor("o_parts", o_parts, o_parts.dim() if isinstance(o_parts, torch.Tensor) else 2, "[..., S, D]")
    _tensor("lse_parts", lse_parts, lse_parts.dim() if isinstance(lse_parts, torch.Tensor) else 1, "[..., S]")
    if o_parts.dim() < 2 or o_parts.shape[:-1] != lse_parts.shape:
        raise KernelArgumentError(f"lse_parts must have shape o_parts.shape[:-1] = {tuple(o_parts.shape[:-1])}, "
                                  f"got {tuple(lse_parts.shape)}", key="lse_parts",
                                  fix="pass one LSE per partial output row")
    return call("qsa", backend, "merge_states", o_parts, lse_parts, policy=policy)


def output_gate(o, gate, *, policy=None, backend="torch", fallback=None):
    """``o * sigmoid(gate)``, rounded to the output dtype.

    ``policy.gate_round_output`` rounds o to the output dtype (``policy.output_dtype``, else
    gate's dtype) before the gate, as a kernel that writes o and gates it in a second pass does.

    Parameters
    ----------
    o: ``[B, HQ, D]`` attention output (fp32); gate: ``[B, HQ, D]`` gate logits

    Returns
    -------
    ``[B, HQ, D]`` in the output dtype

    Example
    -------
    >>> output_gate(torch.ones(1, 1, 2), torch.zeros(1, 1, 2, dtype=torch.bfloat16)).tolist()
    [[[0.5, 0.5]]]
    """
    _tensor("o", o, 3, "[B, HQ, D]")
    _tensor("gate", gate, 3, "[B, HQ, D]")
    if o.shape != gate.shape:
        raise KernelArgumentError(f"gate must have o's shape {tuple(o.shape)}, got {tuple(gate.shape)}",
                                  key="gate", fix="pass one gate logit per output element")
    return call("qsa", backend, "output_gate", o, gate, policy=policy, fallback=fallback)
