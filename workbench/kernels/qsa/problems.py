"""Random QSA decode problems at given shapes, for tests, benchmarks and notebooks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.kernels.qsa import oracle
from workbench.kernels.qsa._select import select_tokens
from workbench.kernels.qsa.paged import PagedKVCache

__all__ = ["DecodeProblem", "decode_problem"]


@dataclass
class DecodeProblem:
    q: torch.Tensor            # [B, HQ, D]
    cache: PagedKVCache        # k/v [num_pages, ratio, HKV, D]
    indices: torch.Tensor      # [B, budget + ratio - 1] int32
    gate: torch.Tensor         # [B, HQ, D]
    pos: int

    def to(self, device) -> "DecodeProblem":
        c = self.cache
        return DecodeProblem(self.q.to(device), PagedKVCache(c.k.to(device), c.v.to(device), c.block_table.to(device),
                                                             c.seqlens.to(device)),
                             self.indices.to(device), self.gate.to(device), self.pos)


def decode_problem(*, B: int, HQ: int, HKV: int, D: int, seqlen: int, budget: int = 2048, ratio: int = 4,
                   index_heads: int = 4, dtype=torch.bfloat16, seed: int = 0, shuffle_pages: bool = True,
                   order: str = "topk") -> DecodeProblem:
    """Decode token at ``pos = seqlen - 1`` over a paged cache with random physical pages; the
    indices come from the indexer (block keys, scores, top-k selection) on random index keys."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(B, seqlen, HKV, D, generator=g).to(dtype)
    v = torch.randn(B, seqlen, HKV, D, generator=g).to(dtype)
    q = torch.randn(B, HQ, D, generator=g).to(dtype)
    gate = torch.randn(B, HQ, D, generator=g).to(dtype)
    cache = PagedKVCache.from_dense(k, v, page_size=ratio, seed=seed if shuffle_pages else None)
    ik = torch.randn(B, seqlen, 64, generator=g)
    iq = torch.randn(B, index_heads, 64, generator=g)
    pos = seqlen - 1
    scores = oracle.index_scores(iq, oracle.block_keys(ik, ratio=ratio), pos=pos, ratio=ratio)
    indices = select_tokens(scores, budget=budget, ratio=ratio, pos=pos, seqlen=seqlen, order=order)
    return DecodeProblem(q, cache, indices, gate, pos)
