"""Token selection from indexer scores, shared by every backend (integer logic, no rounding)."""

from __future__ import annotations

import torch

__all__ = ["select_tokens", "visible_blocks"]


def visible_blocks(pos: int, ratio: int) -> int:
    """Blocks complete at query position ``pos`` (the query sees tokens 0..pos)."""
    return (pos + 1) // ratio


def select_tokens(scores: torch.Tensor, *, budget: int, ratio: int, pos, seqlen, order: str) -> torch.Tensor:
    B, NB = scores.shape
    L = budget + ratio - 1
    k_blocks = budget // ratio
    pos_t = torch.as_tensor(pos).reshape(-1).expand(B).tolist()
    seq_t = torch.as_tensor(pos if seqlen is None else seqlen).reshape(-1).expand(B).tolist()
    if seqlen is None:
        seq_t = [p + 1 for p in pos_t]
    out = torch.full((B, L), -1, dtype=torch.int32)
    s = scores.detach().to("cpu", torch.float64)
    for b in range(B):
        p, n = int(pos_t[b]), int(seq_t[b])
        end = min(p + 1, n)  # causal and inside the stored sequence
        nvis = min(visible_blocks(p, ratio), NB)
        if nvis <= k_blocks:
            toks = torch.arange(0, end)  # below the budget: the whole causal prefix, in order
        else:
            if order == "topk":
                # descending score; stable sort keeps the lower block index first on ties
                blocks = torch.sort(-s[b, :nvis], stable=True).indices[:k_blocks]
            else:
                blocks = torch.sort(torch.sort(-s[b, :nvis], stable=True).indices[:k_blocks]).values
            toks = (blocks[:, None] * ratio + torch.arange(ratio)[None, :]).reshape(-1)
            tail = torch.arange(nvis * ratio, p + 1)
            toks = torch.cat([toks, tail])
            toks = toks[toks < end]
        out[b, : toks.numel()] = toks.to(torch.int32)
    return out.to(scores.device)
