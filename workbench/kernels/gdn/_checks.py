"""Argument checks shared by every GDN backend.

The public functions in :mod:`workbench.kernels.gdn` call these before dispatching, so a backend's
launcher receives tensors whose ranks, shapes, dtypes and devices agree. Every failure raises
:class:`~workbench.errors.KernelArgumentError` naming the argument, what was expected and what
came.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.errors import KernelArgumentError

__all__ = ["GDNShape", "check_gdn", "check_gates", "check_conv", "check_rmsnorm", "resolve_chunk",
           "l2norm"]

_FLOATS = (torch.float64, torch.float32, torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class GDNShape:
    B: int
    T: int
    H: int
    HV: int
    K: int
    V: int
    scale: float

    @property
    def group(self) -> int:
        """Value heads per q/k head (the GVA ratio)."""
        return self.HV // self.H


def _fail(name: str, expected: str, got, fix: str | None = None):
    raise KernelArgumentError(f"{name}: expected {expected}, got {got}", key=name, fix=fix)


def _tensor(name: str, x, rank: int, layout: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        _fail(name, f"a torch.Tensor {layout}", type(x).__name__, f"pass {name} as a torch tensor")
    if x.dim() != rank:
        _fail(name, f"rank {rank} {layout}", f"rank {x.dim()} with shape {tuple(x.shape)}",
              f"reshape {name} to {layout}")
    if x.dtype not in _FLOATS:
        _fail(name, "a floating dtype (float32, bfloat16, float16, float64)", x.dtype)
    return x


def _same_device(named: dict[str, torch.Tensor]) -> None:
    items = [(n, t) for n, t in named.items() if t is not None]
    ref_name, ref = items[0]
    for n, t in items[1:]:
        if t.device != ref.device:
            _fail(n, f"device {ref.device} (the device of {ref_name})", t.device,
                  f"move every tensor to one device, e.g. {n}.to({ref_name}.device)")


def check_gdn(q, k, v, g, beta, scale, initial_state) -> GDNShape:
    """Check the arguments of ``recurrent``/``chunked``; return the problem's dimensions."""
    _tensor("q", q, 4, "[B, T, H, K]")
    _tensor("k", k, 4, "[B, T, H, K]")
    _tensor("v", v, 4, "[B, T, HV, V]")
    _tensor("g", g, 3, "[B, T, HV]")
    _tensor("beta", beta, 3, "[B, T, HV]")
    B, T, H, K = q.shape
    if tuple(k.shape) != tuple(q.shape):
        _fail("k", f"shape {tuple(q.shape)} (the shape of q, [B, T, H, K])", tuple(k.shape))
    if v.shape[0] != B or v.shape[1] != T:
        _fail("v", f"shape [B={B}, T={T}, HV, V] (B and T of q)", tuple(v.shape))
    HV, V = v.shape[2], v.shape[3]
    if H < 1 or HV % H != 0:
        _fail("v", f"a number of value heads HV that is a multiple of H={H} (GVA)",
              f"HV={HV} (shape {tuple(v.shape)})",
              "value head i reads q/k head i // (HV // H); HV must be H, 2H, 4H, ...")
    for name, x in (("g", g), ("beta", beta)):
        if tuple(x.shape) != (B, T, HV):
            _fail(name, f"shape [B, T, HV] = {(B, T, HV)}", tuple(x.shape))
    if k.dtype != q.dtype or v.dtype != q.dtype:
        bad, dt = ("k", k.dtype) if k.dtype != q.dtype else ("v", v.dtype)
        _fail(bad, f"dtype {q.dtype} (the dtype of q; q, k and v share one dtype)", dt,
              f"cast with {bad}.to({q.dtype})")
    if initial_state is not None:
        _tensor("initial_state", initial_state, 4, "[B, HV, K, V]")
        if tuple(initial_state.shape) != (B, HV, K, V):
            _fail("initial_state", f"shape [B, HV, K, V] = {(B, HV, K, V)}",
                  tuple(initial_state.shape))
        if initial_state.dtype not in (torch.float32, torch.float64):
            _fail("initial_state", "dtype float32 (or float64)", initial_state.dtype,
                  "keep the recurrent state in float32; use policy state_dtype to emulate bf16/fp16")
    _same_device(dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state))
    if scale is None:
        scale = K ** -0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        _fail("scale", "a float or None (None: K ** -0.5)", type(scale).__name__)
    return GDNShape(B, T, H, HV, K, V, float(scale))


def resolve_chunk(chunk_size, policy) -> int:
    """``chunk_size`` argument, or the policy's when None."""
    c = policy.chunk_size if chunk_size is None else chunk_size
    if isinstance(c, bool) or not isinstance(c, int) or c < 1:
        _fail("chunk_size", "a positive int or None (None: policy.chunk_size)", repr(c))
    return c


def check_gates(a, b, A_log, dt_bias) -> None:
    _tensor("a", a, 3, "[B, T, HV]")
    _tensor("b", b, 3, "[B, T, HV]")
    if tuple(b.shape) != tuple(a.shape):
        _fail("b", f"shape {tuple(a.shape)} (the shape of a)", tuple(b.shape))
    HV = a.shape[-1]
    for name, x in (("A_log", A_log), ("dt_bias", dt_bias)):
        _tensor(name, x, 1, "[HV]")
        if x.shape[0] != HV:
            _fail(name, f"shape [HV] = ({HV},)", tuple(x.shape))
    _same_device(dict(a=a, b=b, A_log=A_log, dt_bias=dt_bias))


def check_conv(x, weight, state) -> int:
    """Check ``causal_conv1d`` arguments; return the kernel width W."""
    _tensor("x", x, 3, "[B, T, D]")
    _tensor("weight", weight, 2, "[D, W]")
    B, T, D = x.shape
    if weight.shape[0] != D:
        _fail("weight", f"shape [D={D}, W]", tuple(weight.shape))
    W = weight.shape[1]
    if state is not None:
        _tensor("state", state, 3, "[B, D, W - 1]")
        if tuple(state.shape) != (B, D, W - 1):
            _fail("state", f"shape [B, D, W - 1] = {(B, D, W - 1)}", tuple(state.shape))
    _same_device(dict(x=x, weight=weight, state=state))
    return W


def check_rmsnorm(x, z, weight, eps) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        _fail("x", "a torch.Tensor [..., D]", getattr(x, "shape", type(x).__name__))
    _tensor("x", x, x.dim(), "[..., D]")
    _tensor("z", z, x.dim(), "[..., D] (the shape of x)")
    if tuple(z.shape) != tuple(x.shape):
        _fail("z", f"shape {tuple(x.shape)} (the shape of x)", tuple(z.shape))
    _tensor("weight", weight, 1, "[D]")
    if weight.shape[0] != x.shape[-1]:
        _fail("weight", f"shape [D] = ({x.shape[-1]},)", tuple(weight.shape))
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or eps < 0:
        _fail("eps", "a non-negative float", repr(eps))
    _same_device(dict(x=x, z=z, weight=weight))


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum x^2 + 1e-6) over the last dim, in x's dtype (the models' in-kernel norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)
