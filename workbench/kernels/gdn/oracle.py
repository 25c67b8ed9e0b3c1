"""FP64 oracle of the Gated DeltaNet ops: plain torch in float64, the truth the other backends
are judged against.

Inputs are converted to float64 once (no other rounding happens) and the outputs are float64.
``recurrent`` runs the per-step recurrence; ``chunked`` the chunked (UT/WY) form, algebraically
identical and much faster on a GPU (T = 8192 in well under a second). Both run on the inputs'
device.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.kernels.gdn._checks import check_gdn, l2norm, resolve_chunk
from workbench.kernels.gdn._chunk import chunk_step
from workbench.kernels.registry import backend_op
from workbench.kernels.gdn._varlen import per_sequence

OPS = ("recurrent", "chunked", "gates", "causal_conv1d", "gated_rmsnorm")
# float64 throughout: the numerics policy does not apply (the truth every policy is judged against)
KNOBS = None

__all__ = ["recurrent", "chunked", "gates", "causal_conv1d", "gated_rmsnorm", "is_available"]

F64 = torch.float64


def is_available() -> tuple[bool, str]:
    return True, "plain torch in float64"


def _prepare(q, k, v, g, beta, scale, initial_state, qk_l2norm):
    s = check_gdn(q, k, v, g, beta, scale, initial_state)
    q, k, v, g, beta = (x.to(F64) for x in (q, k, v, g, beta))
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    # value head i reads q/k head i // group
    q = q.repeat_interleave(s.group, dim=2)
    k = k.repeat_interleave(s.group, dim=2)
    S = (torch.zeros(s.B, s.HV, s.K, s.V, dtype=F64, device=q.device) if initial_state is None
         else initial_state.to(F64).clone())
    return s, q, k, v, g, beta, S


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False, cu_seqlens=None,
              policy=None):
    """Step-by-step recurrence in float64; see :func:`workbench.kernels.gdn.recurrent`."""
    if cu_seqlens is not None:  # a packed batch: each sequence alone (workbench.kernels.gdn._varlen)
        return per_sequence(recurrent, q, k, v, g, beta, cu_seqlens, initial_state, scale=scale,
                            qk_l2norm=qk_l2norm, policy=policy)
    s, q, k, v, g, beta, S = _prepare(q, k, v, g, beta, scale, initial_state, qk_l2norm)
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=F64, device=q.device)
    for t in range(s.T):
        S = S * g[:, t].exp()[..., None, None]
        kt = k[:, t]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, kt))
        S = S + kt[..., :, None] * u[..., None, :]
        o[:, t] = s.scale * torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o, S


@backend_op
def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False,
            chunk_size=None, cu_seqlens=None, policy=None):
    """Chunked (UT/WY) form in float64; see :func:`workbench.kernels.gdn.chunked`."""
    if cu_seqlens is not None:  # a packed batch: each sequence alone, no chunk crosses a boundary
        return per_sequence(chunked, q, k, v, g, beta, cu_seqlens, initial_state, scale=scale,
                            qk_l2norm=qk_l2norm, chunk_size=chunk_size, policy=policy)
    C = resolve_chunk(chunk_size, policy)
    s, q, k, v, g, beta, S = _prepare(q, k, v, g, beta, scale, initial_state, qk_l2norm)
    # [B, HV, T, *] so that per-head matrices are the trailing two dims
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)
    o = torch.empty(s.B, s.HV, s.T, s.V, dtype=F64, device=q.device)
    for t0 in range(0, s.T, C):
        sl = slice(t0, min(t0 + C, s.T))
        S, o[:, :, sl] = chunk_step(S, q[:, :, sl], k[:, :, sl], v[:, :, sl], g[:, :, sl],
                                     beta[:, :, sl], s.scale)
    return o.transpose(1, 2), S


def gates(a, b, A_log, dt_bias, *, policy=None):
    """g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), in float64."""
    a, b, A_log, dt_bias = (x.to(F64) for x in (a, b, A_log, dt_bias))
    return -A_log.exp() * F.softplus(a + dt_bias), torch.sigmoid(b)


def causal_conv1d(x, weight, *, state=None, policy=None):
    """Depthwise causal conv over time + SiLU in float64; returns (y, new_state)."""
    B, T, D = x.shape
    W = weight.shape[1]
    x, weight = x.to(F64), weight.to(F64)
    prev = (torch.zeros(B, D, W - 1, dtype=F64, device=x.device) if state is None
            else state.to(F64))
    xp = torch.cat([prev, x.transpose(1, 2)], dim=-1)  # [B, D, W - 1 + T]
    y = sum(weight[None, :, i, None] * xp[..., i:i + T] for i in range(W))
    return F.silu(y).transpose(1, 2), xp[..., T:].clone()


def gated_rmsnorm(x, z, weight, eps=1e-6, *, policy=None):
    """weight * x / sqrt(mean(x^2) + eps) * silu(z) over the last dim, in float64."""
    x, z, weight = x.to(F64), z.to(F64), weight.to(F64)
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * F.silu(z)
