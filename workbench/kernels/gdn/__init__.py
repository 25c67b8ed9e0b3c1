"""Gated DeltaNet (GDN) linear attention: an FP64 oracle and several implementations.

Per step, for every value head (layouts as in flash-linear-attention)::

    S = exp(g) S;   u = beta (v - S^T k);   S = S + k u^T;   o = scale S^T q

Backends (``backend=``): ``oracle`` (float64), ``torch`` (numerics-policy rounding points),
``numba`` (numba.cuda kernels), ``ext`` (native C++/CUDA in ``kernels/gdn/``), ``fla``
(flash-linear-attention's Triton kernels), ``flashinfer`` (FlashInfer's chunked prefill, ``chunked``
only). ``workbench.kernels.backends("gdn")`` lists them with
their availability. Each public function checks its arguments, then calls the backend's launcher
with the same keyword arguments.
"""

from __future__ import annotations

from workbench.kernels.gdn import _checks
from workbench.kernels.registry import call, register_backend, register_knobs

__all__ = ["recurrent", "chunked", "gates", "causal_conv1d", "gated_rmsnorm", "BACKENDS"]

BACKENDS = ("oracle", "torch", "numba", "ext", "fla", "flashinfer")
# the policy knobs GDN ops read; each backend's KNOBS says which values it honours
_RECURRENCE = ("input_dtype", "accum_dtype", "state_dtype", "output_dtype", "cuda_path")
register_knobs("gdn", {"recurrent": _RECURRENCE, "chunked": (*_RECURRENCE, "chunk_size"), "gates": ("accum_dtype",),
                       "causal_conv1d": ("accum_dtype", "output_dtype"),
                       "gated_rmsnorm": ("accum_dtype", "output_dtype")})

register_backend("gdn", "oracle", "workbench.kernels.gdn.oracle",
                 description="float64 torch, the truth")
register_backend("gdn", "torch", "workbench.kernels.gdn.torch_ref",
                 description="torch with numerics-policy rounding points")
register_backend("gdn", "numba", "workbench.kernels.gdn.numba_cuda",
                 install_hint="needs a CUDA GPU with numba-cuda (pip install numba-cuda "
                              "nvidia-cuda-nvrtc-cu12), or NUMBA_ENABLE_CUDASIM=1 for the simulator",
                 description="numba.cuda decode, prefill recurrence and chunked prefill kernels")
register_backend("gdn", "ext", "workbench.kernels.gdn.ext",
                 install_hint="needs a C++ compiler (apt-get install g++) for CPU tensors and "
                              "nvcc (CUDA toolkit) for CUDA tensors",
                 description="native C++/CUDA kernels from kernels/gdn/")
register_backend("gdn", "fla", "workbench.kernels.gdn.fla",
                 install_hint="pip install flash-linear-attention==0.6.0 fla-core==0.6.0 "
                              "(needs a CUDA GPU and triton)",
                 description="flash-linear-attention chunk/fused_recurrent_gated_delta_rule")
register_backend("gdn", "flashinfer", "workbench.kernels.gdn.flashinfer",
                 install_hint="pip install flashinfer-python (needs a CUDA GPU; its GDN prefill "
                              "runs on the CuTe DSL, nvidia-cutlass-dsl)",
                 description="FlashInfer chunk_gated_delta_rule (chunked prefill; K = V)")


def _packed(cu_seqlens) -> dict:
    # passed only when given: a third-party backend written before packed batches still serves
    # unpacked calls
    return {} if cu_seqlens is None else {"cu_seqlens": cu_seqlens}


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False, cu_seqlens=None,
              backend="torch", policy=None):
    """Gated delta rule, step by step (prefill recurrence, or decode with T = 1).

    Parameters
    ----------
    q, k : [B, T, H, K] float32 / bf16 / fp16
        Queries and keys; value head i reads q/k head i // (HV // H).
    v : [B, T, HV, V], same dtype as q
        Values; HV must be a multiple of H.
    g : [B, T, HV] float
        Log decay per step (<= 0; the state is multiplied by exp(g)).
    beta : [B, T, HV] float
        Write strength of the delta rule, in (0, 1).
    scale : float, optional
        Query scale; None means K ** -0.5.
    initial_state : [B, HV, K, V] float32, optional
        State before the first step (None: zeros).
    qk_l2norm : bool
        L2-normalize q and k over K first (x / sqrt(sum x^2 + 1e-6)), as Qwen3-Next does.
    cu_seqlens : list of int or 1-D int tensor [N + 1], optional
        A packed batch, as engines run prefill: B = 1 and sequence i is tokens
        ``cu_seqlens[i]:cu_seqlens[i + 1]`` of T, with ``initial_state [N, HV, K, V]`` (one per
        sequence) and ``final_state [N, HV, K, V]``; no state crosses a boundary. Empty and
        length-1 sequences are allowed. Every backend gives the same bits as running each
        sequence alone, except fla and flashinfer (their own packed kernels). Read on the host:
        pass a list or a CPU tensor.
    backend : str
        One of ``BACKENDS``; see ``workbench.kernels.backends("gdn")``.
    policy : Policy or dict, optional
        Numerics policy (None: the current one); the ``torch`` backend honours every knob.

    Returns
    -------
    o : [B, T, HV, V]
        Output, in ``policy.output_dtype`` (None: v's dtype); float64 from the oracle.
    final_state : [B, HV, K, V] float32 (float64 from the oracle); [N, HV, K, V] for a packed batch

    Examples
    --------
    >>> import torch
    >>> from workbench.kernels import gdn
    >>> q = k = torch.randn(1, 5, 2, 8); v = torch.randn(1, 5, 4, 8)
    >>> g = -torch.rand(1, 5, 4); beta = torch.rand(1, 5, 4)
    >>> o, S = gdn.recurrent(q, k, v, g, beta, qk_l2norm=True)
    >>> o.shape, S.shape
    (torch.Size([1, 5, 4, 8]), torch.Size([1, 4, 8, 8]))
    """
    # every backend checks its arguments itself (check_gdn): checking here too would double the
    # Python cost of a decode step
    return call("gdn", backend, "recurrent", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                qk_l2norm=qk_l2norm, policy=policy, **_packed(cu_seqlens))


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False,
            chunk_size=None, cu_seqlens=None, backend="torch", policy=None):
    """Gated delta rule in chunked (UT/WY) form: the same result as :func:`recurrent`.

    Parameters are those of :func:`recurrent`, plus

    chunk_size : int, optional
        Tokens per chunk (None: ``policy.chunk_size``, 64 by default). T need not be a multiple.
    cu_seqlens : list of int or 1-D int tensor [N + 1], optional
        A packed batch (see :func:`recurrent`); chunks never cross a sequence boundary: each
        sequence is chunked from its own first token.

    Returns
    -------
    o : [B, T, HV, V], final_state : [B, HV, K, V] float32

    Examples
    --------
    >>> import torch
    >>> from workbench.kernels import gdn
    >>> q = k = torch.randn(1, 100, 2, 8); v = torch.randn(1, 100, 2, 16)
    >>> g = -torch.rand(1, 100, 2); beta = torch.rand(1, 100, 2)
    >>> o, S = gdn.chunked(q, k, v, g, beta, qk_l2norm=True, chunk_size=32)
    >>> o2, S2 = gdn.recurrent(q, k, v, g, beta, qk_l2norm=True)
    >>> bool((o - o2).abs().max() < 1e-4)
    True
    """
    if chunk_size is not None:
        _checks.resolve_chunk(chunk_size, None)
    return call("gdn", backend, "chunked", q, k, v, g, beta, scale=scale, initial_state=initial_state,
                qk_l2norm=qk_l2norm, chunk_size=chunk_size, policy=policy, knobs={"chunk_size": chunk_size},
                **_packed(cu_seqlens))


def gates(a, b, A_log, dt_bias, *, backend="torch", policy=None, fallback=None):
    """Decay and write strength from the projections: g = -exp(A_log) softplus(a + dt_bias),
    beta = sigmoid(b).

    Parameters
    ----------
    a, b : [B, T, HV] float
    A_log, dt_bias : [HV] float
    fallback : str, optional
        Backend to run this op when ``backend`` does not implement it (the native and fla backends
        implement only ``recurrent`` and ``chunked``): e.g. ``"torch"``. The substitution is warned
        about once and recorded in ``workbench.kernels.fallbacks()``; without it such a call is a
        BackendUnavailableError listing the backends that implement the op.

    Returns
    -------
    g, beta : [B, T, HV] float32 (float64 from the oracle)

    Examples
    --------
    >>> import torch
    >>> from workbench.kernels import gdn
    >>> g, beta = gdn.gates(torch.zeros(1, 1, 2), torch.zeros(1, 1, 2), torch.zeros(2), torch.zeros(2))
    >>> round(float(g[0, 0, 0]), 4), float(beta[0, 0, 0])
    (-0.6931, 0.5)
    """
    _checks.check_gates(a, b, A_log, dt_bias)
    return call("gdn", backend, "gates", a, b, A_log, dt_bias, policy=policy, fallback=fallback)


def causal_conv1d(x, weight, *, state=None, backend="torch", policy=None, fallback=None):
    """Depthwise causal convolution over time followed by SiLU, with a rolling state for decode.

    Parameters
    ----------
    x : [B, T, D] float
    weight : [D, W] float (W = 4 in the models)
    state : [B, D, W - 1], optional
        The last W - 1 inputs before x (None: zeros).
    fallback : str, optional
        As for :func:`gates`: the backend to run this op when ``backend`` does not implement it.

    Returns
    -------
    y : [B, T, D]
    new_state : [B, D, W - 1]
        The last W - 1 inputs, to pass as ``state`` of the next call.

    Examples
    --------
    >>> import torch
    >>> from workbench.kernels import gdn
    >>> y, st = gdn.causal_conv1d(torch.randn(2, 7, 6), torch.randn(6, 4))
    >>> y.shape, st.shape
    (torch.Size([2, 7, 6]), torch.Size([2, 6, 3]))
    """
    _checks.check_conv(x, weight, state)
    return call("gdn", backend, "causal_conv1d", x, weight, state=state, policy=policy, fallback=fallback)


def gated_rmsnorm(x, z, weight, eps=1e-6, *, backend="torch", policy=None, fallback=None):
    """Gated RMSNorm of the GDN output: weight * x / sqrt(mean(x^2) + eps) * silu(z).

    Parameters
    ----------
    x, z : [..., D] float
    weight : [D] float
    eps : float
    fallback : str, optional
        As for :func:`gates`: the backend to run this op when ``backend`` does not implement it.

    Returns
    -------
    y : [..., D], in x's dtype (float64 from the oracle)

    Examples
    --------
    >>> import torch
    >>> from workbench.kernels import gdn
    >>> gdn.gated_rmsnorm(torch.randn(3, 8), torch.randn(3, 8), torch.ones(8)).shape
    torch.Size([3, 8])
    """
    _checks.check_rmsnorm(x, z, weight, eps)
    return call("gdn", backend, "gated_rmsnorm", x, z, weight, eps, policy=policy, fallback=fallback)
