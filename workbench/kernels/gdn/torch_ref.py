"""GDN in torch with every rounding point set by the numerics policy.

Rounding points, in the order the data meets them:

- ``policy.input_dtype``: q, k, v (and beta) are materialized in this dtype before the kernel reads
  them (None: as given), as an engine that stores activations in bf16 would;
- ``policy.accum_dtype``: every product, dot product and matrix product runs in this dtype
  ("fp32" or "fp64");
- ``policy.state_dtype``: the recurrent state is rounded to this dtype after every step
  (``recurrent``) or at every chunk boundary (``chunked``), which reproduces the quality loss of a
  bf16 or fp16 state cache; the returned state holds those rounded values, in float32;
- ``policy.output_dtype``: o is rounded to this dtype (None: the dtype of v);
- ``policy.chunk_size`` (or the ``chunk_size`` argument): the chunk length of ``chunked``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.kernels.gdn._checks import check_gdn, l2norm, resolve_chunk
from workbench.kernels.gdn._chunk import chunk_step
from workbench.numerics.dtypes import torch_dtype
from workbench.kernels.registry import backend_op
from workbench.kernels.gdn._varlen import per_sequence

OPS = ("recurrent", "chunked", "gates", "causal_conv1d", "gated_rmsnorm")
# it honours every value of every GDN knob but the native kernels' cuda_path
KNOBS = {"input_dtype": None, "accum_dtype": None, "state_dtype": None, "output_dtype": None, "chunk_size": None}

__all__ = ["recurrent", "chunked", "gates", "causal_conv1d", "gated_rmsnorm", "is_available"]


def is_available() -> tuple[bool, str]:
    return True, "torch with numerics-policy rounding points (any device)"


class _Rounding:
    def __init__(self, policy, io_dtype):
        self.acc = torch_dtype(policy.accum_dtype)
        self.inp = torch_dtype(policy.input_dtype) if policy.input_dtype else None
        self.state = torch_dtype(policy.state_dtype)
        self.out = torch_dtype(policy.output_dtype) if policy.output_dtype else io_dtype

    def input(self, x):
        if self.inp is not None:
            x = x.to(self.inp)
        return x.to(self.acc)

    def store_state(self, S):
        """Round the state to its storage dtype and back to the compute dtype."""
        return S.to(self.state).to(self.acc)


def _prepare(q, k, v, g, beta, scale, initial_state, qk_l2norm, policy):
    s = check_gdn(q, k, v, g, beta, scale, initial_state)
    p = policy
    r = _Rounding(p, v.dtype)
    q, k, v, beta = (r.input(x) for x in (q, k, v, beta))
    g = g.to(r.acc)
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    q = q.repeat_interleave(s.group, dim=2)
    k = k.repeat_interleave(s.group, dim=2)
    S = (torch.zeros(s.B, s.HV, s.K, s.V, dtype=r.acc, device=q.device) if initial_state is None
         else r.store_state(initial_state))
    return s, p, r, q, k, v, g, beta, S


@backend_op
def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False, cu_seqlens=None,
              policy=None):
    """Per-step recurrence; the state is rounded to ``policy.state_dtype`` after every step."""
    if cu_seqlens is not None:  # a packed batch: each sequence alone (workbench.kernels.gdn._varlen)
        return per_sequence(recurrent, q, k, v, g, beta, cu_seqlens, initial_state, scale=scale,
                            qk_l2norm=qk_l2norm, policy=policy)
    s, p, r, q, k, v, g, beta, S = _prepare(q, k, v, g, beta, scale, initial_state, qk_l2norm,
                                            policy)
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=r.acc, device=q.device)
    for t in range(s.T):
        S = S * g[:, t].exp()[..., None, None]
        kt = k[:, t]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", S, kt))
        S = r.store_state(S + kt[..., :, None] * u[..., None, :])
        o[:, t] = s.scale * torch.einsum("bhkv,bhk->bhv", S, q[:, t])
    return o.to(r.out), S.to(torch.float32)


@backend_op
def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False,
            chunk_size=None, cu_seqlens=None, policy=None):
    """Chunked (UT/WY) form; the state is rounded to ``policy.state_dtype`` at chunk boundaries."""
    if cu_seqlens is not None:  # a packed batch: each sequence alone, no chunk crosses a boundary
        return per_sequence(chunked, q, k, v, g, beta, cu_seqlens, initial_state, scale=scale,
                            qk_l2norm=qk_l2norm, chunk_size=chunk_size, policy=policy)
    s, p, r, q, k, v, g, beta, S = _prepare(q, k, v, g, beta, scale, initial_state, qk_l2norm,
                                            policy)
    C = resolve_chunk(chunk_size, p)
    q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    g, beta = g.transpose(1, 2), beta.transpose(1, 2)
    o = torch.empty(s.B, s.HV, s.T, s.V, dtype=r.acc, device=q.device)
    for t0 in range(0, s.T, C):
        sl = slice(t0, min(t0 + C, s.T))
        S, o[:, :, sl] = chunk_step(S, q[:, :, sl], k[:, :, sl], v[:, :, sl], g[:, :, sl],
                                     beta[:, :, sl], s.scale)
        S = r.store_state(S)
    return o.transpose(1, 2).to(r.out), S.to(torch.float32)


@backend_op
def gates(a, b, A_log, dt_bias, *, policy=None):
    """g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b); float32 (accum_dtype) out."""
    acc = torch_dtype(policy.accum_dtype)
    a, b, A_log, dt_bias = (x.to(acc) for x in (a, b, A_log, dt_bias))
    g = -A_log.exp() * F.softplus(a + dt_bias)
    return g.to(torch.float32), torch.sigmoid(b).to(torch.float32)


@backend_op
def causal_conv1d(x, weight, *, state=None, policy=None):
    """Depthwise causal conv + SiLU in accum_dtype; y in output_dtype (None: x's dtype)."""
    p = policy
    acc = torch_dtype(p.accum_dtype)
    out = torch_dtype(p.output_dtype) if p.output_dtype else x.dtype
    B, T, D = x.shape
    W = weight.shape[1]
    prev = (torch.zeros(B, D, W - 1, dtype=acc, device=x.device) if state is None
            else state.to(acc))
    xp = torch.cat([prev, x.to(acc).transpose(1, 2)], dim=-1)
    w = weight.to(acc)
    y = w[None, :, 0, None] * xp[..., 0:T]
    for i in range(1, W):
        y = y + w[None, :, i, None] * xp[..., i:i + T]
    new_state = xp[..., T:].to(state.dtype if state is not None else x.dtype)
    return F.silu(y).transpose(1, 2).to(out), new_state


@backend_op
def gated_rmsnorm(x, z, weight, eps=1e-6, *, policy=None):
    """Qwen3-Next RMSNormGated: normalize in accum_dtype, round to x's dtype, scale, gate."""
    p = policy
    acc = torch_dtype(p.accum_dtype)
    out = torch_dtype(p.output_dtype) if p.output_dtype else x.dtype
    xa = x.to(acc)
    h = (xa * torch.rsqrt(xa.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight * h).to(acc).mul(F.silu(z.to(acc))).to(out)
