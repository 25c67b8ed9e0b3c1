"""Adapter to FlashInfer's GDN chunked prefill (``flashinfer.gdn_prefill.chunk_gated_delta_rule``;
on Hopper its CuTe DSL kernels; GPU only).

FlashInfer takes packed ``[tokens, heads, dim]`` inputs with ``cu_seqlens`` and keeps its states as
``[N, HV, V, K]``; ours are ``[B, T, H, K]`` and ``[N, HV, K, V]``. The adapter packs a batch of B
as B sequences of T (a packed batch as it is), passes the gates in the log domain
(``gate_domain="log"``: our g), beta and the states in float32, the initial state transposed,
the longest sequence as ``max_seqlen`` (the host hint engines pass), and gives o and the final
state back in our layouts. FlashInfer picks its own kernel (``use_cp="auto"``: context-parallel
kernels for few long sequences, a fused kernel otherwise). It takes bf16 or fp16 q, k, v (``policy.input_dtype``
``"bf16"`` / ``"fp16"`` materializes them so, as the other backends' input rounding point: a
replay of captures loaded in float32 asks for it), one head size for q/k and v (K = V; on SM90
and SM100 only 128, which FlashInfer itself checks), float32 state and accumulators and chunks of
64, so a policy that asks for anything else is refused.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from workbench.errors import KernelArgumentError
from workbench.kernels.gdn._checks import check_gdn
from workbench.kernels.gdn._varlen import check_packed
from workbench.numerics.dtypes import torch_dtype

OPS = ("chunked",)
DEVICES = ("cuda",)
KNOBS = {"input_dtype": (None, "bf16", "fp16"), "output_dtype": (None,), "accum_dtype": ("fp32",), "state_dtype": ("fp32",),
         "chunk_size": (64,), "cuda_path": ("auto",)}

__all__ = ["call_arguments", "chunked", "is_available"]

INSTALL = "pip install flashinfer-python (0.7.4 was measured; needs a CUDA GPU and the CuTe DSL, nvidia-cutlass-dsl)"


@lru_cache(maxsize=None)
def _fi():
    from flashinfer.gdn_prefill import chunk_gated_delta_rule
    return chunk_gated_delta_rule


def is_available() -> tuple[bool, str]:
    try:
        _fi()
    except Exception as e:
        return False, f"FlashInfer's GDN prefill does not import ({type(e).__name__}: {e}); {INSTALL}"
    if not torch.cuda.is_available():
        return False, "FlashInfer's GDN prefill needs a CUDA GPU (torch.cuda is not available)"
    return True, "FlashInfer " + _version()


def _version() -> str:
    try:
        import flashinfer
        return getattr(flashinfer, "__version__", "?")
    except Exception:  # pragma: no cover
        return "?"


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False,
            chunk_size=None, cu_seqlens=None, policy=None):
    if cu_seqlens is None:
        s = check_gdn(q, k, v, g, beta, scale, initial_state)
        offs = [s.T * i for i in range(s.B + 1)]
    else:
        offs = check_packed(q, k, v, cu_seqlens, initial_state)
        s = check_gdn(q, k, v, g, beta, scale, None if initial_state is None else initial_state[:1])
    inp = getattr(policy, "input_dtype", None)
    if inp:  # the policy's input rounding point: q, k, v materialized in bf16 / fp16
        q, k, v = (t.to(torch_dtype(inp)) for t in (q, k, v))
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise KernelArgumentError(
            f"q: FlashInfer's GDN prefill takes bf16 or fp16 q, k, v, got {q.dtype}", key="q",
            fix="pass q, k, v in bf16 (as engines run it) or the policy input_dtype='bf16' (a replay "
                "of float32-loaded captures), or use another backend (ext, fla, torch)")
    if s.K != s.V:
        raise KernelArgumentError(
            f"v: FlashInfer's GDN prefill takes one head size for q/k and v, got K = {s.K}, V = {s.V}",
            key="v", fix="use another backend (ext, fla) for K != V")
    if s.B * s.T == 0:
        h0 = _fi_state(initial_state, len(offs) - 1, s.HV, s.K, s.V, q.device)
        return torch.zeros(s.B, 0, s.HV, s.V, dtype=v.dtype, device=q.device), h0.transpose(-1, -2).contiguous()
    args, kwargs, out_state = call_arguments(q, k, v, g, beta, scale=s.scale, offsets=offs,
                                             initial_state=initial_state, qk_l2norm=qk_l2norm)
    o, _ = _fi()(*args, **kwargs)
    return o.reshape(s.B, s.T, *o.shape[1:]), out_state.transpose(-1, -2).contiguous()


def _fi_state(initial_state, n, HV, K, V, dev):
    """Initial states in FlashInfer's layout: [n, HV, V, K] float32 (zeros where none)."""
    if initial_state is None:
        return torch.zeros(n, HV, V, K, dtype=torch.float32, device=dev)
    return initial_state.to(torch.float32).transpose(-1, -2).contiguous()


def call_arguments(q, k, v, g, beta, *, scale: float, offsets, initial_state=None, qk_l2norm=False):
    """FlashInfer's ``chunk_gated_delta_rule`` arguments for inputs in our layouts: ``(args, kwargs,
    out_state)``, so that ``chunk_gated_delta_rule(*args, **kwargs)`` writes o (returned,
    ``[tokens, HV, V]``) and the final states into ``out_state`` (``[n, HV, V, K]``, FlashInfer's;
    ours is its ``transpose(-1, -2)``). q, k: ``[B, T, H, K]``, v ``[B, T, HV, V]``, g and beta
    ``[B, T, HV]`` (B = 1 for a packed batch), ``offsets`` the n + 1 token offsets of the sequences
    (a batch of B: ``0, T, .., B T``), ``initial_state`` ``[n, HV, K, V]`` or None (zeros). The
    tensors are new (packed, float32 gates and beta, the states transposed), so a caller may keep
    them for a CUDA graph; ``out_state`` starts as the initial states, which an empty sequence keeps.
    Arguments are taken as checked (``chunked`` checks them)."""
    B, T = q.shape[0], q.shape[1]
    HV, K, V = v.shape[2], k.shape[3], v.shape[3]
    n, dev, tokens = len(offsets) - 1, q.device, B * T
    offsets = [int(x) for x in offsets]

    def packed(x):
        return x.reshape(tokens, *x.shape[2:]).contiguous()

    h0 = _fi_state(initial_state, n, HV, K, V, dev)
    # an empty sequence's final state is its initial state: the kernel may leave its row unwritten
    out_state = h0.clone()
    longest = max((b - a for a, b in zip(offsets, offsets[1:])), default=0)
    args = (packed(q), packed(k), packed(v), packed(g).float(), packed(beta).float())
    kwargs = dict(scale=scale, initial_state=h0, output_final_state=True, output_state=out_state,
                  cu_seqlens=torch.tensor(offsets, dtype=torch.int32, device=dev),
                  use_qk_l2norm_in_kernel=qk_l2norm, max_seqlen=max(longest, 1), gate_domain="log")
    return args, kwargs, out_state
