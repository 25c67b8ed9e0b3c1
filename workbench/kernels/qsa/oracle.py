"""FP64 truth of the QSA ops: plain torch in float64, no splits, no rounding but the inputs'.

The oracle ignores ``num_splits`` and ``policy`` (the exact result does not depend on them); it
has them so that its keyword signature is the one every backend shares.
"""

from __future__ import annotations

import math

import torch

from workbench.kernels.qsa._select import select_tokens
from workbench.kernels.qsa.paged import check_decode_args, unpack_cache, visit_slots

OPS = ("block_keys", "index_scores", "select", "sparse_decode", "merge_states", "output_gate")
# float64 throughout: the numerics policy does not apply (the truth every policy is judged against)
KNOBS = None

__all__ = ["block_keys", "index_scores", "select", "sparse_decode", "merge_states", "output_gate",
           "is_available"]

LOG2E = 1.0 / math.log(2.0)


def is_available() -> tuple[bool, str]:
    return True, "plain torch float64"


def block_keys(k, *, ratio=4, norm=None, policy=None):
    B, T, D = k.shape
    nb = T // ratio
    kb = k[:, : nb * ratio].double().reshape(B, nb, ratio, D).mean(dim=2)
    return norm(kb) if norm is not None else kb


def _visible_mask(nb, ratio, pos, B, device):
    pos = torch.as_tensor(pos, device=device).reshape(-1).expand(B)
    blk = torch.arange(nb, device=device)
    return (blk[None, :] + 1) * ratio <= (pos[:, None] + 1)


def index_scores(q_index, block_keys, *, pos, ratio=4, policy=None):
    B, HI, D = q_index.shape
    s = torch.relu(torch.einsum("bhd,bnd->bhn", q_index.double(), block_keys.double())).sum(1) / math.sqrt(D)
    vis = _visible_mask(block_keys.shape[1], ratio, pos, B, s.device)
    return torch.where(vis, s, torch.full_like(s, -math.inf))


def select(scores, *, budget, ratio=4, pos, seqlen=None, order="topk"):
    return select_tokens(scores, budget=budget, ratio=ratio, pos=pos, seqlen=seqlen, order=order)


def sparse_decode(q, kv_cache, block_table, indices, *, scale=None, num_splits=None, policy=None):
    k_cache, v_cache = unpack_cache(kv_cache)
    check_decode_args(q, k_cache, v_cache, block_table, indices,
                      num_splits if num_splits is not None else (policy.num_kv_splits if policy is not None else 1))
    B, HQ, D = q.shape
    _, ps, HKV, _ = k_cache.shape
    scale = D ** -0.5 if scale is None else scale
    slots = visit_slots(block_table, indices, ps, "logical")
    valid = slots >= 0
    k = k_cache.reshape(-1, HKV, D)[slots.clamp(min=0)].double()  # [B, L, HKV, D]
    v = v_cache.reshape(-1, HKV, D)[slots.clamp(min=0)].double()
    G = HQ // HKV
    qg = q.double().reshape(B, HKV, G, D)
    s = torch.einsum("bhgd,blhd->bhgl", qg, k) * (scale * LOG2E)
    s = torch.where(valid[:, None, None, :], s, torch.full_like(s, -math.inf))
    m = s.amax(-1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp2(s - m_safe)
    l = p.sum(-1, keepdim=True)
    o = torch.einsum("bhgl,blhd->bhgd", p, v) / torch.where(l > 0, l, torch.ones_like(l))
    lse = torch.where(l > 0, m_safe + torch.log2(l), torch.full_like(l, -math.inf))
    return o.reshape(B, HQ, D), lse.reshape(B, HQ)


def merge_states(o_parts, lse_parts, *, policy=None):
    o_parts = o_parts.double(); lse_parts = lse_parts.double()
    m = lse_parts.amax(-1, keepdim=True)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    w = torch.exp2(lse_parts - m_safe)  # exp2(-inf) = 0: an empty part contributes nothing
    sw = w.sum(-1, keepdim=True)
    o = (w[..., None] * o_parts).sum(-2) / torch.where(sw > 0, sw, torch.ones_like(sw))
    lse = torch.where(sw > 0, m_safe + torch.log2(sw), torch.full_like(sw, -math.inf))
    return o, lse.squeeze(-1)


def output_gate(o, gate, *, policy=None):
    return o.double() * torch.sigmoid(gate.double())
