"""Packed variable-length GDN batches (``cu_seqlens``), as serving engines run prefill.

A packed batch holds N sequences end to end along T of a ``B = 1`` batch: sequence ``i`` is tokens
``cu_seqlens[i]:cu_seqlens[i + 1]``, with its own initial state ``initial_state[i]`` and final
state ``final_state[i]`` (``[N, HV, K, V]``). No state, chunk or normalization crosses a boundary.

:func:`per_sequence` runs a backend's own op on each sequence alone and packs the results, so a
packed batch equals its sequences run alone, bit for bit, in every backend that computes this way
(oracle, torch, numba, ext). Empty sequences are allowed (their final state is their initial
state, zeros when none is given); length-1 sequences are decode-like steps.

The offsets are read on the host: pass ``cu_seqlens`` as a list or a CPU tensor (a CUDA tensor
is read back, which synchronizes and cannot be captured in a CUDA graph).
"""

from __future__ import annotations

import numbers

import torch

from workbench.errors import KernelArgumentError

__all__ = ["offsets", "check_packed", "per_sequence"]


def offsets(cu_seqlens, T: int) -> list[int]:
    """The sequence offsets as Python ints, checked: 1-D, integers, ``[0, ..., T]``, non-decreasing."""
    if isinstance(cu_seqlens, torch.Tensor):
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
            raise KernelArgumentError(f"cu_seqlens must be a 1-D integer tensor, got {cu_seqlens.dtype} "
                                      f"{tuple(cu_seqlens.shape)}", key="cu_seqlens",
                                      fix="pass torch.tensor([0, len0, len0 + len1, ...], dtype=torch.int32)")
        offs = [int(x) for x in cu_seqlens.tolist()]
    else:
        items = list(cu_seqlens) if isinstance(cu_seqlens, (list, tuple)) else None
        if items is None or not all(isinstance(x, numbers.Integral) and not isinstance(x, bool) for x in items):
            raise KernelArgumentError(f"cu_seqlens must be a list or 1-D tensor of ints, got {cu_seqlens!r}"[:200],
                                      key="cu_seqlens", fix="pass [0, len0, len0 + len1, ...] (ints)")
        offs = [int(x) for x in items]
    if len(offs) < 2 or offs[0] != 0 or offs[-1] != T:
        raise KernelArgumentError(f"cu_seqlens must start at 0 and end at T={T} (at least one sequence), got "
                                  f"{offs[:4]}{'...' if len(offs) > 4 else ''}{offs[-1:] if len(offs) > 4 else ''}",
                                  key="cu_seqlens", fix="pass the cumulative lengths [0, len0, len0 + len1, ..., T]")
    bad = next((i for i in range(1, len(offs)) if offs[i] < offs[i - 1]), None)
    if bad is not None:
        raise KernelArgumentError(f"cu_seqlens must be non-decreasing; cu_seqlens[{bad}]={offs[bad]} < "
                                  f"cu_seqlens[{bad - 1}]={offs[bad - 1]}", key="cu_seqlens",
                                  fix="pass cumulative lengths (a sequence's length is never negative)")
    return offs


def check_packed(q, k, v, cu_seqlens, initial_state) -> list[int]:
    """Check a packed batch (B = 1, offsets, one initial state per sequence); its offsets."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise KernelArgumentError(f"{name} must be a [1, T, heads, dim] tensor for a packed batch", key=name,
                                      fix="pack the sequences along T of a batch of one")
    B, T = q.shape[0], q.shape[1]
    if B != 1:
        raise KernelArgumentError(f"a packed batch (cu_seqlens) has B = 1, got B = {B}", key="q",
                                  fix="concatenate the sequences along T: q of shape [1, sum of lengths, H, K]")
    offs = offsets(cu_seqlens, T)
    N = len(offs) - 1
    HV, V, K = v.shape[2], v.shape[3], k.shape[3]
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != (N, HV, K, V):
            raise KernelArgumentError(f"initial_state of a packed batch must be [N={N}, HV={HV}, K={K}, V={V}] "
                                      f"(one per sequence), got {tuple(getattr(initial_state, 'shape', ()))}",
                                      key="initial_state", fix="stack one state per sequence, or pass None")
    return offs


def per_sequence(fn, q, k, v, g, beta, cu_seqlens, initial_state, **kw):
    """``fn`` (a backend's ``recurrent`` or ``chunked``) on each packed sequence alone.

    Returns ``o [1, T, HV, V]`` and ``final_state [N, HV, K, V]`` (in the dtype ``fn`` returns).
    """
    offs = check_packed(q, k, v, cu_seqlens, initial_state)
    N = len(offs) - 1
    HV, V, K = v.shape[2], v.shape[3], k.shape[3]
    outs, states = [], [None] * N
    for i in range(N):
        a, b = offs[i], offs[i + 1]
        s0 = None if initial_state is None else initial_state[i:i + 1]
        if b == a:
            continue  # an empty sequence: no output; its final state is its initial state (below)
        o, s = fn(q[:, a:b], k[:, a:b], v[:, a:b], g[:, a:b], beta[:, a:b], initial_state=s0, **kw)
        outs.append(o)
        states[i] = s
    ran = next((s for s in states if s is not None), None)
    sdt = ran.dtype if ran is not None else torch.float32
    for i in range(N):
        if states[i] is None:
            states[i] = (torch.zeros(1, HV, K, V, dtype=sdt, device=q.device) if initial_state is None
                         else initial_state[i:i + 1].to(sdt))
    if outs:
        o = torch.cat(outs, 1)
    else:  # every sequence empty (T = 0)
        o = torch.zeros(1, 0, HV, V, dtype=q.dtype, device=q.device)
    return o, torch.cat(states, 0)
