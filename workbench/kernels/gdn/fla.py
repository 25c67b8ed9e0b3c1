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

# the helper ops run through the torch implementation (same keyword signatures)
from workbench.kernels.gdn._checks import check_gdn
from workbench.kernels.gdn._varlen import check_packed

# the ops this backend implements itself; the helper ops (gates, conv, gated norm) are torch's
# or the oracle's, reached through fallback= (workbench.kernels.registry.get_op)
OPS = ("recurrent", "chunked")
DEVICES = ("cuda",)  # CUDA tensors
# what fla's kernels do, fixed inside them (the dispatcher refuses other values): float32 state
# and accumulators, chunks of 64, inputs and outputs in v's dtype
KNOBS = {"input_dtype": (None,), "output_dtype": (None,), "accum_dtype": ("fp32",), "state_dtype": ("fp32",),
         "chunk_size": (64,), "cuda_path": ("auto",)}

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


def _state(initial_state):
    return None if initial_state is None else initial_state.to(torch.float32).contiguous()


def _run(which, q, k, v, g, beta, scale, initial_state, qk_l2norm, cu_seqlens=None):
    extra = {}
    if cu_seqlens is None:
        s = check_gdn(q, k, v, g, beta, scale, initial_state)
    else:  # fla packs sequences itself: one launch, cu_seqlens as an int64 tensor on the device
        offs = check_packed(q, k, v, cu_seqlens, initial_state)
        s = check_gdn(q, k, v, g, beta, scale, None if initial_state is None else initial_state[:1])
        extra["cu_seqlens"] = torch.tensor(offs, dtype=torch.long, device=q.device)
    chunk, fused = _fla()
    o, st = (chunk if which == "chunked" else fused)(
        q=q, k=k, v=v, g=g.float(), beta=beta.to(q.dtype), scale=s.scale, initial_state=_state(initial_state),
        output_final_state=True, use_qk_l2norm_in_kernel=qk_l2norm, **extra)
    return o, st


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False, cu_seqlens=None,
              policy=None):
    return _run("recurrent", q, k, v, g, beta, scale, initial_state, qk_l2norm, cu_seqlens)


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False,
            chunk_size=None, cu_seqlens=None, policy=None):
    return _run("chunked", q, k, v, g, beta, scale, initial_state, qk_l2norm, cu_seqlens)  # chunk 64: KNOBS
