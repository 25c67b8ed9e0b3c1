"""Shared launcher plumbing of the compiled backends (numba, ext): the float32 staging of inputs
that their chunked kernels read (:func:`stage`) and the copy-free arguments of their recurrence
kernels (:func:`stage_direct`). (Which policy values they honour is declared in their ``KNOBS`` and
checked by the dispatcher, :func:`workbench.kernels.registry.call`.)"""

from __future__ import annotations

import torch

from workbench.kernels.gdn._checks import check_gdn, l2norm, resolve_chunk
from workbench.numerics.dtypes import native_code, torch_dtype

__all__ = ["stage", "stage_direct", "check_direct", "empty_result", "DIRECT"]

# dtypes the recurrence kernels (ext and numba) read (q, k, v, g, beta) and write (o) as given,
# with the native ABI's code of each (fp32 0, bf16 1, fp16 2) that selects the load and the store
DIRECT = {t: native_code(t) for t in (torch.float32, torch.bfloat16, torch.float16)}


def stage(backend, q, k, v, g, beta, scale, initial_state, qk_l2norm, policy, chunk_size=None,
          widen=True, state=True):
    """Check arguments; return (shape, policy, chunk, float32 contiguous tensors, out dtype).

    The kernels read float32: q, k, v and beta are materialized in ``policy.input_dtype`` first
    (when set) and then widened; the L2 norm of q and k is applied here, in float32.
    ``widen=False`` leaves q, k and v contiguous in their (materialized) dtype when no L2 norm is
    applied, for kernels that read bf16 / fp16 themselves. ``state=False``: no state is made
    (None in its place; the caller makes what its kernels need).
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
    state = state_copy(s, initial_state, q.device) if state else None
    return s, p, C, (q, k, v, g, beta), state, out


def state_copy(s, initial_state, device):
    """A float32 copy of the initial state (zeros: none), for kernels that update it in place."""
    return (torch.zeros(s.B, s.HV, s.K, s.V, dtype=torch.float32, device=device)
            if initial_state is None else initial_state.to(torch.float32).clone().contiguous())


def state_source(initial_state):
    """The initial state as kernels that read it where it lies take it (``h0``): float32 and
    contiguous (a copy only when it is not), or None (zeros)."""
    h0 = initial_state
    if h0 is not None and (h0.dtype != torch.float32 or not h0.is_contiguous()):
        h0 = h0.to(torch.float32).contiguous()
    return h0


def _direct(x: torch.Tensor, inp) -> torch.Tensor:
    """x materialized in ``inp`` (when set), kept in its dtype if the recurrence kernels read it,
    else float32; contiguous (no copy when it already is)."""
    if inp is not None:
        x = x.to(inp)
    return (x if x.dtype in DIRECT else x.to(torch.float32)).contiguous()


def stage_direct(q, k, v, g, beta, scale, initial_state, policy):
    """Arguments of the recurrence kernels, without staging copies where none are needed.

    q, k, v, g and beta keep their dtype when it is float32, bf16 or fp16 (q, k, v and beta are
    materialized in ``policy.input_dtype`` first when set; a widening load in the kernel gives the
    values a float32 copy would hold); the initial state is used where it is when it is a
    contiguous float32 tensor (``h0``, None: zeros), the final state goes to a new tensor and o
    is allocated in the output dtype (float32 when the kernels cannot write that dtype).

    Returns (shape, (q, k, v, g, beta), h0, state, o, out dtype).
    """
    s = check_gdn(q, k, v, g, beta, scale, initial_state)
    p = policy
    inp = torch_dtype(p.input_dtype) if p.input_dtype else None
    out = torch_dtype(p.output_dtype) if p.output_dtype else v.dtype
    q, k, v, beta = (_direct(x, inp) for x in (q, k, v, beta))
    g = _direct(g, None)
    h0 = state_source(initial_state)
    state = torch.empty(s.B, s.HV, s.K, s.V, dtype=torch.float32, device=q.device)
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=out if out in DIRECT else torch.float32, device=q.device)
    return s, (q, k, v, g, beta), h0, state, o, out


def check_direct(backend, tensors, o):
    """The recurrence kernels' dtype contract: q, k, v (one dtype), g, beta and o each in DIRECT."""
    from workbench.errors import KernelArgumentError

    q, k, v, g, beta = tensors
    for name, x in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("o", o)):
        if x.dtype not in DIRECT:
            raise KernelArgumentError(f"{name}: the {backend} recurrence reads and writes {list(DIRECT)}, got "
                                      f"{x.dtype}", key=name)
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise KernelArgumentError(f"q, k, v: one dtype for all three, got {[q.dtype, k.dtype, v.dtype]}", key="q")


def empty_result(h0, state):
    """The final state of a recurrence with no steps (T = 0 or B = 0): the initial state or zeros."""
    return torch.zeros_like(state) if h0 is None else h0.clone()
