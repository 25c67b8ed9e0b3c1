"""QSA in plain torch with every rounding point taken from the numerics policy.

Knobs honoured (see :class:`workbench.numerics.Policy`): ``input_dtype`` (q, k, v materialized
before the kernel reads them), ``accum_dtype`` (scores, softmax sums and P.V accumulators),
``prob_dtype`` (probabilities rounded before P.V; the softmax denominator uses the unrounded
ones, as flash-decoding kernels do), ``num_kv_splits`` / ``partition_size`` (split-KV),
``page_order`` (tokens visited in list order or in physical slot order), ``output_dtype`` and
``gate_round_output`` (output gate).
"""

from __future__ import annotations

import math

import torch

from workbench.kernels.qsa._select import select_tokens
from workbench.kernels.qsa.paged import check_decode_args, unpack_cache, visit_slots
from workbench.numerics.dtypes import torch_dtype
from workbench.kernels.registry import backend_op

OPS = ("block_keys", "index_scores", "select", "sparse_decode", "merge_states", "output_gate")
# every value of every QSA knob
KNOBS = {k: None for k in ("input_dtype", "accum_dtype", "prob_dtype", "output_dtype", "partition_size",
                           "num_kv_splits", "page_order", "gate_round_output")}

__all__ = ["block_keys", "index_scores", "select", "sparse_decode", "merge_states", "output_gate",
           "is_available", "split_layout"]

LOG2E = 1.0 / math.log(2.0)


def is_available() -> tuple[bool, str]:
    return True, "plain torch"


def split_layout(L: int, num_splits: int, policy) -> tuple[int, int]:
    """(splits, partition) for L listed tokens: policy.partition_size wins over num_splits."""
    if policy.partition_size is not None:
        P = policy.partition_size
        return max(1, -(-L // P)), P
    S = max(1, min(num_splits, L)) if L else 1
    return S, max(1, -(-L // S))


def _acc(policy) -> torch.dtype:
    return torch_dtype(policy.accum_dtype)


@backend_op
def block_keys(k, *, ratio=4, norm=None, policy=None):
    B, T, D = k.shape
    nb = T // ratio
    kb = k[:, : nb * ratio].to(_acc(policy)).reshape(B, nb, ratio, D).mean(dim=2)
    return norm(kb) if norm is not None else kb


@backend_op
def index_scores(q_index, block_keys, *, pos, ratio=4, policy=None):
    acc = _acc(policy)
    B, HI, D = q_index.shape
    s = torch.relu(torch.einsum("bhd,bnd->bhn", q_index.to(acc), block_keys.to(acc))).sum(1) / math.sqrt(D)
    pos = torch.as_tensor(pos, device=s.device).reshape(-1).expand(B)
    vis = (torch.arange(block_keys.shape[1], device=s.device)[None, :] + 1) * ratio <= (pos[:, None] + 1)
    return torch.where(vis, s, torch.full_like(s, -math.inf))


def select(scores, *, budget, ratio=4, pos, seqlen=None, order="topk"):
    return select_tokens(scores, budget=budget, ratio=ratio, pos=pos, seqlen=seqlen, order=order)


def _materialize(x, policy):
    return x if policy.input_dtype is None else x.to(torch_dtype(policy.input_dtype))


@backend_op
def split_partials(q, kv_cache, block_table, indices, *, scale=None, num_splits=None, policy=None):
    """Per-split outputs ``[B, HQ, S, D]`` and base-2 LSE ``[B, HQ, S]`` (empty split: 0, -inf)."""
    k_cache, v_cache = unpack_cache(kv_cache)
    acc = _acc(policy)
    B, HQ, D = q.shape
    _, ps, HKV, _ = k_cache.shape
    G = HQ // HKV
    scale = D ** -0.5 if scale is None else scale
    slots = visit_slots(block_table, indices, ps, policy.page_order)
    L = slots.shape[1]
    S, P = split_layout(L, policy.num_kv_splits if num_splits is None else num_splits, policy)
    slots = torch.nn.functional.pad(slots, (0, S * P - L), value=-1)
    valid = slots >= 0
    kf = _materialize(k_cache, policy).reshape(-1, HKV, D)
    vf = _materialize(v_cache, policy).reshape(-1, HKV, D)
    k = kf[slots.clamp(min=0)].to(acc)  # [B, S*P, HKV, D]
    v = vf[slots.clamp(min=0)].to(acc)
    qg = _materialize(q, policy).to(acc).reshape(B, HKV, G, D)
    s = torch.einsum("bhgd,blhd->bhgl", qg, k) * (scale * LOG2E)
    s = torch.where(valid[:, None, None, :], s, torch.full_like(s, -math.inf)).reshape(B, HKV, G, S, P)
    m = s.amax(-1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp2(s - m_safe)
    l = p.sum(-1, keepdim=True)
    p_mat = p.to(torch_dtype(policy.prob_dtype)).to(acc)
    vs = v.reshape(B, S, P, HKV, D)
    o = torch.einsum("bhgsp,bsphd->bhgsd", p_mat, vs)
    o = o / torch.where(l > 0, l, torch.ones_like(l))
    lse = torch.where(l > 0, m_safe + torch.log2(l), torch.full_like(l, -math.inf)).squeeze(-1)
    return o.reshape(B, HQ, S, D), lse.reshape(B, HQ, S)


@backend_op
def merge_states(o_parts, lse_parts, *, policy=None):
    acc = _acc(policy)
    o_parts = o_parts.to(acc); lse_parts = lse_parts.to(acc)
    m = lse_parts.amax(-1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp2(lse_parts - m_safe)
    sw = w.sum(-1, keepdim=True)
    o = (w[..., None] * o_parts).sum(-2) / torch.where(sw > 0, sw, torch.ones_like(sw))
    lse = torch.where(sw > 0, m_safe + torch.log2(sw), torch.full_like(sw, -math.inf))
    return o, lse.squeeze(-1)


@backend_op
def sparse_decode(q, kv_cache, block_table, indices, *, scale=None, num_splits=None, policy=None):
    k_cache, v_cache = unpack_cache(kv_cache)
    check_decode_args(q, k_cache, v_cache, block_table, indices,
                      policy.num_kv_splits if num_splits is None else num_splits)
    o_parts, lse_parts = split_partials(q, kv_cache, block_table, indices, scale=scale,
                                        num_splits=num_splits, policy=policy)
    o, lse = merge_states(o_parts, lse_parts, policy=policy)
    if policy.output_dtype is not None:
        o = o.to(torch_dtype(policy.output_dtype))
    return o, lse.float()


@backend_op
def output_gate(o, gate, *, policy=None):
    odt = torch_dtype(policy.output_dtype) if policy.output_dtype else gate.dtype
    x = o.float()
    if policy.gate_round_output:
        x = x.to(odt).float()
    return (x * torch.sigmoid(gate.float())).to(odt)
