"""The chunked (WY/UT) form of the gated delta rule shared by the oracle and the torch backend."""

from __future__ import annotations

import torch


def chunk_step(S, q, k, v, g, beta, scale):
    """One chunk of the gated delta rule in WY/UT form, in the dtype of its inputs.

    S: [B, HV, K, V] state before the chunk; q, k: [B, HV, L, K]; v: [B, HV, L, V];
    g, beta: [B, HV, L]. Returns (state after the chunk, o of the chunk [B, HV, L, V]). The
    oracle calls it in float64, the torch backend in its accumulator dtype.
    """
    L = q.shape[-2]
    gc = g.cumsum(-1)
    diff = gc[..., :, None] - gc[..., None, :]
    strict = torch.ones(L, L, dtype=torch.bool, device=q.device).tril(-1)
    incl = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
    # masked before exp: above the diagonal gc_i - gc_j > 0 could overflow
    decay = torch.where(incl, diff, torch.full_like(diff, -torch.inf)).exp()
    A = torch.where(strict, beta[..., :, None] * (k @ k.transpose(-1, -2)) * decay,
                    torch.zeros_like(diff))
    eye = torch.eye(L, dtype=q.dtype, device=q.device)
    rhs = beta[..., None] * (v - gc.exp()[..., None] * (k @ S))
    u = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
    o = scale * (gc.exp()[..., None] * (q @ S) + ((q @ k.transpose(-1, -2)) * decay) @ u)
    last = gc[..., -1:]
    S = last.exp()[..., None] * S + (k * (last - gc).exp()[..., None]).transpose(-1, -2) @ u
    return S, o
