"""Shared launcher plumbing of the compiled backends (numba, ext): the float32 staging of inputs
that their kernels read. (Which policy values they honour is declared in their ``KNOBS`` and
checked by the dispatcher, :func:`workbench.kernels.registry.call`.)"""

from __future__ import annotations

import torch

from workbench.kernels.gdn._checks import check_gdn, l2norm, resolve_chunk
from workbench.numerics.dtypes import torch_dtype

__all__ = ["stage"]


def stage(backend, q, k, v, g, beta, scale, initial_state, qk_l2norm, policy, chunk_size=None,
          widen=True):
    """Check arguments; return (shape, policy, chunk, float32 contiguous tensors, out dtype).

    The kernels read float32: q, k, v and beta are materialized in ``policy.input_dtype`` first
    (when set) and then widened; the L2 norm of q and k is applied here, in float32.
    ``widen=False`` leaves q, k and v contiguous in their (materialized) dtype when no L2 norm is
    applied, for kernels that read bf16 / fp16 themselves.
    """
    s = check_gdn(q, k, v, g, beta, scale, initial_state)
    p = policy  # a Policy (the dispatcher's, or backend_op's for a direct call)
    C = resolve_chunk(chunk_size, p)
    inp = torch_dtype(p.input_dtype) if p.input_dtype else None
    out = torch_dtype(p.output_dtype) if p.output_dtype else v.dtype

    def f32(x):
        if inp is not None:
            x = x.to(inp)
        return x.to(torch.float32).contiguous()

    def keep(x):
        return (x.to(inp) if inp is not None else x).contiguous()

    q, k, v = (f32(x) if widen or qk_l2norm else keep(x) for x in (q, k, v))
    beta = f32(beta)
    if qk_l2norm:
        q, k = l2norm(q).contiguous(), l2norm(k).contiguous()
    g = g.to(torch.float32).contiguous()
    state = (torch.zeros(s.B, s.HV, s.K, s.V, dtype=torch.float32, device=q.device)
             if initial_state is None else initial_state.to(torch.float32).clone().contiguous())
    return s, p, C, (q, k, v, g, beta), state, out
