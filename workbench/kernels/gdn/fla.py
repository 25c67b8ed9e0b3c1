"""Adapter to flash-linear-attention's production Triton kernels (GPU only).

``recurrent`` calls ``fla.ops.gated_delta_rule.fused_recurrent_gated_delta_rule`` and ``chunked``
calls ``chunk_gated_delta_rule``; both receive our layouts unchanged (fla's layouts are ours).
fla fixes its own rounding points (fp32 state and accumulators, chunk size 64), so a policy that
asks for anything else is refused rather than silently ignored. g is passed as float32 and beta in
q's dtype (as the models call fla). The helper ops run through the ``torch`` backend (fla's are
module classes, not functions of the same contract).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from workbench.errors import KernelArgumentError
# the helper ops run through the torch implementation (same keyword signatures)
from workbench.kernels.gdn._checks import check_gdn, resolve_chunk
from workbench.numerics.policy import resolve_policy

# the ops this backend implements itself; the helper ops (gates, conv, gated norm) are torch's
# or the oracle's, reached through fallback= (workbench.kernels.registry.get_op)
OPS = ("recurrent", "chunked")

__all__ = ["recurrent", "chunked", "is_available"]

INSTALL = "pip install flash-linear-attention==0.6.0 fla-core==0.6.0 (needs triton and a CUDA GPU)"


@lru_cache(maxsize=None)
def _fla():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


def is_available() -> tuple[bool, str]:
    try:
        _fla()
    except Exception as e:
        return False, f"flash-linear-attention does not import ({type(e).__name__}: {e}); {INSTALL}"
    if not torch.cuda.is_available():
        return False, "flash-linear-attention's Triton kernels need a CUDA GPU (torch.cuda is not available)"
    return True, "flash-linear-attention " + _version()


def _version() -> str:
    try:
        import fla
        return getattr(fla, "__version__", "?")
    except Exception:  # pragma: no cover
        return "?"


def _check_policy(policy, chunk_size=None):
    p = resolve_policy(policy)
    fixed = dict(state_dtype="fp32", accum_dtype="fp32")
    for knob, want in fixed.items():
        if getattr(p, knob) != want:
            raise KernelArgumentError(
                f"policy.{knob}: expected {want!r} (fixed inside fla's kernels), got {getattr(p, knob)!r}",
                key="policy", fix="use backend='torch' to emulate other rounding points")
    if p.input_dtype is not None or p.output_dtype is not None:
        raise KernelArgumentError(
            "policy.input_dtype/output_dtype: expected None for backend 'fla' (it reads and writes "
            f"the dtype of v), got {p.input_dtype!r}/{p.output_dtype!r}", key="policy",
            fix="cast the inputs yourself, or use backend='torch'")
    if chunk_size is not None and resolve_chunk(chunk_size, p) != 64:
        raise KernelArgumentError(f"chunk_size: expected 64 (fla's chunk), got {chunk_size}",
                                  key="chunk_size", fix="use backend='torch' for other chunk sizes")
    return p


def _state(initial_state):
    return None if initial_state is None else initial_state.to(torch.float32).contiguous()


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False, policy=None):
    s = check_gdn(q, k, v, g, beta, scale, initial_state)
    _check_policy(policy)
    _, fused = _fla()
    o, st = fused(q=q, k=k, v=v, g=g.float(), beta=beta.to(q.dtype), scale=s.scale,
                  initial_state=_state(initial_state), output_final_state=True,
                  use_qk_l2norm_in_kernel=qk_l2norm)
    return o, st


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False,
            chunk_size=None, policy=None):
    s = check_gdn(q, k, v, g, beta, scale, initial_state)
    _check_policy(policy, chunk_size)
    chunk, _ = _fla()
    o, st = chunk(q=q, k=k, v=v, g=g.float(), beta=beta.to(q.dtype), scale=s.scale,
                  initial_state=_state(initial_state), output_final_state=True,
                  use_qk_l2norm_in_kernel=qk_l2norm)
    return o, st
