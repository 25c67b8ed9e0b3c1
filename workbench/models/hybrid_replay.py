"""Replay adapters for the tensor names the bundled hybrid decoder writes
(:mod:`workbench.models.hybrid`), registered through the ``workbench.replay_adapters`` entry
points (pyproject.toml) under ``gdn``, ``gdn_chunked``, ``qsa_merge`` and ``qsa``.

``gdn`` (a decode step of :func:`workbench.kernels.gdn.recurrent`)
    inputs ``gdn/q, k`` ``[T, H, K]``, ``v`` ``[T, HV, V]``, ``g, beta`` ``[T, HV]`` at the step,
    initial state ``gdn/state`` ``[HV, K, V]`` of the step before (zeros at step 0), ``qk_l2norm``
    on (as the model); outputs ``core`` (``[T, HV, V]``) and ``state``. Keys whose inputs are
    sliced (tag ``positions``) or whose previous state is missing are skipped. A packed prefill
    (engines pack sequences along T) is replayed as it was run when the step also holds
    ``cu_seqlens`` ``[N + 1]``: ``state`` is then ``[N, HV, K, V]``, the initial states
    ``gdn/initial_state`` ``[N, HV, K, V]`` at the step when captured, else the step before's
    ``state`` when it holds N sequences (zeros at step 0).

``gdn_chunked`` (the same cases through :func:`workbench.kernels.gdn.chunked`)
    the inputs and outputs of ``gdn``, replayed through the chunked kernels an engine runs its
    prefill with (the mma path of ``ext``, ``fla``, ``flashinfer``, which implements ``chunked``
    only); its reference is the oracle's chunked form.

Each reads the op the bundled decoder writes (``gdn``, ``qsa``); ``replay(..., capture_op=)`` points
it at the same tensor names under another op (an engine's module name, say).
``qsa_merge`` (split-KV merge and output gate: :func:`merge_states`, :func:`output_gate`)
    inputs ``qsa/partial_o`` ``[T, HQ, S, D]``, ``partial_lse`` ``[T, HQ, S]``, ``gate``
    ``[T, HQ, D]``; outputs ``o``, ``lse``, ``gated``.
``qsa`` (the sparse decode :func:`sparse_decode`)
    inputs ``qsa/q`` ``[B, HQ, D]``, ``k_cache``, ``v_cache`` ``[pages, page, HKV, D]``,
    ``block_table`` ``[B, pages]``, ``indices`` ``[B, L]``; outputs ``o``, ``lse``.
"""

from __future__ import annotations

import torch

from workbench.analysis.replay import OpAdapter
from workbench.capture.reader import Capture
from workbench.kernels import gdn, qsa

__all__ = ["GDN", "GDN_CHUNKED", "QSA_MERGE", "QSA"]


def _gdn_load(cap: Capture, rank: int, step: int, layer: int, op: str = "gdn"):
    sel = cap.select(op=op, rank=rank, layer=layer)
    idx = sel.index
    cur = idx[idx["step"] == step]
    names = set(cur["name"])
    if not set(("q", "k", "v", "g", "beta")) <= names:
        return None
    if any("positions" in (t or {}) for t in cur["tags"]):
        return None  # a sliced prefill: its initial state is not captured
    x = {n: sel.get(step=step, name=n)[None].float() for n in ("q", "k", "v", "g", "beta")}
    x["cu_seqlens"] = None
    if "cu_seqlens" in names:  # a packed prefill (engines pack sequences along T): as it was run
        x["cu_seqlens"] = [int(t) for t in sel.get(step=step, name="cu_seqlens").reshape(-1).tolist()]
    n_seq = len(x["cu_seqlens"]) - 1 if x["cu_seqlens"] is not None else 1
    if "initial_state" in names:  # the state each sequence started from, when the engine dumps it
        s0 = sel.get(step=step, name="initial_state").float()
        x["initial_state"] = s0 if x["cu_seqlens"] is not None else s0.reshape(1, *s0.shape[-3:])
        return x
    prev = idx[(idx["step"] == step - 1) & (idx["name"] == "state")]
    if step > 0 and not len(prev):
        return None
    if step > 0:
        s0 = sel.get(step=step - 1, name="state").float()
        if x["cu_seqlens"] is not None:
            if s0.dim() != 4 or s0.shape[0] != n_seq:
                return None  # the previous step held other sequences: this step's start is unknown
            x["initial_state"] = s0
        else:
            x["initial_state"] = s0[None]
    else:
        x["initial_state"] = None
    return x


def _gdn_runner(op: str):
    """The run of a GDN adapter through ``gdn.<op>`` (recurrent or chunked)."""
    def run(x, backend, policy):
        o, s = getattr(gdn, op)(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                qk_l2norm=True, backend=backend, policy=policy, cu_seqlens=x.get("cu_seqlens"))
        return {"core": o[0], "state": s if x.get("cu_seqlens") is not None else s[0]}
    return run


def _merge_load(cap: Capture, rank: int, step: int, layer: int, op: str = "qsa"):
    try:
        return {n: cap.get(op=op, rank=rank, step=step, layer=layer, name=n).float()
                for n in ("partial_o", "partial_lse", "gate")}
    except KeyError:
        return None


def _merge_run(x, backend, policy):
    o, lse = qsa.merge_states(x["partial_o"], x["partial_lse"], policy=policy, backend=backend)
    gate = x["gate"]
    gated = qsa.output_gate(o.float(), gate, policy=policy, backend=backend) if backend != "oracle" else \
        o * torch.sigmoid(gate.double())
    return {"o": o, "lse": lse, "gated": gated}


def _qsa_load(cap: Capture, rank: int, step: int, layer: int, op: str = "qsa"):
    try:
        return {n: cap.get(op=op, rank=rank, step=step, layer=layer, name=n)
                for n in ("q", "k_cache", "v_cache", "block_table", "indices")}
    except KeyError:
        return None


def _qsa_run(x, backend, policy):
    o, lse = qsa.sparse_decode(x["q"], (x["k_cache"], x["v_cache"]), x["block_table"].int(), x["indices"].int(),
                               policy=policy, backend=backend)
    return {"o": o, "lse": lse}


def _adapter(op, names, outputs, load, run, knobs) -> OpAdapter:
    """The adapter for captures that call the op ``op`` (an engine's own module name, say)."""
    return OpAdapter(op, names, outputs, lambda cap, r, s, l: load(cap, r, s, l, op=op), run, knobs=knobs,
                     for_op=lambda other: _adapter(other, names, outputs, load, run, knobs))


_GDN_KNOBS = {"state_dtype": ["bf16", "fp16"], "input_dtype": ["bf16"], "accum_dtype": ["fp64"]}
GDN = _adapter("gdn", ("q", "k", "v", "g", "beta", "state"), ("core", "state"), _gdn_load,
               _gdn_runner("recurrent"), knobs=_GDN_KNOBS)
GDN_CHUNKED = _adapter("gdn", ("q", "k", "v", "g", "beta", "state"), ("core", "state"), _gdn_load,
                       _gdn_runner("chunked"), knobs={**_GDN_KNOBS, "chunk_size": [16]})
QSA_MERGE = _adapter("qsa", ("partial_o", "partial_lse", "gate"), ("o", "lse", "gated"), _merge_load, _merge_run,
                     knobs={"prob_dtype": ["fp16"], "num_kv_splits": [4]})
QSA = _adapter("qsa", ("q", "k_cache", "v_cache", "block_table", "indices"), ("o", "lse"), _qsa_load, _qsa_run,
               knobs={"prob_dtype": ["fp16"], "num_kv_splits": [4]})
