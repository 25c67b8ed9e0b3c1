"""Same-input replay: run an op's captured inputs through chosen backends and numerics policies,
and judge every result against the FP64 oracle and against the captured output.

Captured tensor names map to kernel arguments through a small per-op adapter (:data:`ADAPTERS`):

``gdn`` (a decode step of :func:`workbench.kernels.gdn.recurrent`)
    inputs ``gdn/q, k`` ``[T, H, K]``, ``v`` ``[T, HV, V]``, ``g, beta`` ``[T, HV]`` at the step,
    initial state ``gdn/state`` ``[HV, K, V]`` of the step before (zeros at step 0), ``qk_l2norm``
    on (as the bundled model); outputs ``core`` (``[T, HV, V]``) and ``state``. Keys whose inputs
    are sliced (tag ``positions``) or whose previous state is missing are skipped.
``qsa_merge`` (split-KV merge and output gate: :func:`merge_states`, :func:`output_gate`)
    inputs ``qsa/partial_o`` ``[T, HQ, S, D]``, ``partial_lse`` ``[T, HQ, S]``, ``gate``
    ``[T, HQ, D]``; outputs ``o``, ``lse``, ``gated``.
``qsa`` (the sparse decode :func:`sparse_decode`)
    inputs ``qsa/q`` ``[B, HQ, D]``, ``k_cache``, ``v_cache`` ``[pages, page, HKV, D]``,
    ``block_table`` ``[B, pages]``, ``indices`` ``[B, L]``; outputs ``o``, ``lse``.

A *case* is one (rank, step, layer) key of the op. Variants are ``backend x policy``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import torch
import xarray as xr

from workbench.capture.reader import Capture, open_capture
from workbench.errors import AnalysisError, BackendUnavailableError, KernelArgumentError, PolicyError
from workbench.kernels import gdn, qsa
from workbench.numerics.metrics import compare
from workbench.numerics.policy import Policy, resolve_policy

__all__ = ["ADAPTERS", "OpAdapter", "replay", "counterfactuals", "replay_cases"]


@dataclass(frozen=True)
class OpAdapter:
    """How a captured op becomes kernel calls.

    Attributes
    ----------
    op: the capture's op name; names: the captured input names; outputs: the output names
    load: ``load(capture, rank, step, layer) -> dict | None`` of kernel inputs (None: skip case)
    run: ``run(inputs, backend, policy) -> {output name: tensor}``
    """

    op: str
    names: tuple[str, ...]
    outputs: tuple[str, ...]
    load: Callable
    run: Callable


def _gdn_load(cap: Capture, rank: int, step: int, layer: int):
    sel = cap.select(op="gdn", rank=rank, layer=layer)
    idx = sel.index
    cur = idx[idx["step"] == step]
    if not set(("q", "k", "v", "g", "beta")) <= set(cur["name"]):
        return None
    if any("positions" in (t or {}) for t in cur["tags"]):
        return None  # a sliced prefill: its initial state is not captured
    x = {n: sel.get(step=step, name=n)[None].float() for n in ("q", "k", "v", "g", "beta")}
    prev = idx[(idx["step"] == step - 1) & (idx["name"] == "state")]
    if step > 0 and not len(prev):
        return None
    x["initial_state"] = sel.get(step=step - 1, name="state")[None].float() if step > 0 else None
    return x


def _gdn_run(x, backend, policy):
    o, s = gdn.recurrent(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                         qk_l2norm=True, backend=backend, policy=policy)
    return {"core": o[0], "state": s[0]}


def _merge_load(cap: Capture, rank: int, step: int, layer: int):
    try:
        return {n: cap.get(op="qsa", rank=rank, step=step, layer=layer, name=n).float()
                for n in ("partial_o", "partial_lse", "gate")}
    except KeyError:
        return None


def _merge_run(x, backend, policy):
    o, lse = qsa.merge_states(x["partial_o"], x["partial_lse"], policy=policy, backend=backend)
    gate = x["gate"]
    gated = qsa.output_gate(o.float(), gate, policy=policy, backend=backend) if backend != "oracle" else \
        o * torch.sigmoid(gate.double())
    return {"o": o, "lse": lse, "gated": gated}


def _qsa_load(cap: Capture, rank: int, step: int, layer: int):
    try:
        return {n: cap.get(op="qsa", rank=rank, step=step, layer=layer, name=n)
                for n in ("q", "k_cache", "v_cache", "block_table", "indices")}
    except KeyError:
        return None


def _qsa_run(x, backend, policy):
    o, lse = qsa.sparse_decode(x["q"], (x["k_cache"], x["v_cache"]), x["block_table"].int(), x["indices"].int(),
                               policy=policy, backend=backend)
    return {"o": o, "lse": lse}


ADAPTERS: dict[str, OpAdapter] = {
    "gdn": OpAdapter("gdn", ("q", "k", "v", "g", "beta", "state"), ("core", "state"), _gdn_load, _gdn_run),
    "qsa_merge": OpAdapter("qsa", ("partial_o", "partial_lse", "gate"), ("o", "lse", "gated"), _merge_load, _merge_run),
    "qsa": OpAdapter("qsa", ("q", "k_cache", "v_cache", "block_table", "indices"), ("o", "lse"), _qsa_load, _qsa_run),
}


def _adapter(op: str) -> OpAdapter:
    if op not in ADAPTERS:
        raise AnalysisError(f"no replay adapter for op {op!r}", key="op", fix=f"use one of {sorted(ADAPTERS)}")
    return ADAPTERS[op]


def replay_cases(capture, *, op: str, **filters) -> list[tuple[int, int, int]]:
    """The (rank, step, layer) cases of ``op`` whose inputs the adapter can load."""
    cap = capture if isinstance(capture, Capture) else open_capture(capture)
    ad = _adapter(op)
    idx = cap.select(op=ad.op, name=ad.names[0], **filters).index
    cases = sorted({(int(r), int(s), int(l)) for r, s, l in idx[["rank", "step", "layer"]].itertuples(index=False)})
    return [c for c in cases if ad.load(cap, *c) is not None]


def _label(backend: str, policy: Policy, many_backends: bool) -> str:
    return f"{backend}:{policy.label()}" if many_backends else policy.label()


def _rel(a, ref) -> float:
    return float(compare(ref.double(), a.double()).rel_l2)


def replay(capture, *, op: str, backends: Sequence[str] = ("torch",), policies: Sequence | Mapping | None = None,
           output: str | None = None, max_cases: int | None = None, **filters) -> xr.Dataset:
    """Replay an op's captured inputs through ``backends x policies``.

    Parameters
    ----------
    capture: the capture (or path) holding the inputs and the captured (control) outputs
    op: an adapter of :data:`ADAPTERS` ("gdn", "qsa_merge", "qsa")
    backends: kernel backends (one that cannot run here is skipped and listed in attrs)
    policies: Policies or knob dicts, or ``{label: policy}`` (default: the fp32 ``Policy()``)
    output: the output to judge (default the adapter's first: ``core``, ``o``)
    max_cases: replay at most this many cases (in order)
    filters: restrict the cases (``layer=``, ``step=``, ``rank=``)

    Returns
    -------
    xarray.Dataset with dims ``case`` (coords rank, step, layer) and ``variant``:
    ``err_oracle`` (relative L2 vs the FP64 oracle on the same inputs), ``err_captured`` (vs the
    captured output), ``captured_err_oracle[case]`` (the captured output vs the oracle),
    ``closer[case, variant]`` (strictly closer to FP64 than the captured output) and
    ``n_closer[variant]`` (in how many of the N cases). A variant a backend cannot run is NaN
    and named in attrs ``skipped``.

    Example
    -------
    >>> ds = replay("captures/control", op="gdn", policies=[Policy(), Policy(state_dtype="bf16")],
    ...             layer=0)                                                      # doctest: +SKIP
    >>> ds.n_closer.to_series()                                                  # doctest: +SKIP
    """
    cap = capture if isinstance(capture, Capture) else open_capture(capture)
    ad = _adapter(op)
    out = output or ad.outputs[0]
    if out not in ad.outputs:
        raise AnalysisError(f"output must be one of {list(ad.outputs)}, got {out!r}", key="output",
                            fix=f"pass output={ad.outputs[0]!r}")
    if policies is None:
        policies = {"default": Policy()}
    if not isinstance(policies, Mapping):
        pl = [resolve_policy(p) if not isinstance(p, Policy) else p for p in policies]
        policies = {p.label(): p for p in pl}
    policies = {k: resolve_policy(p) for k, p in policies.items()}
    cases = replay_cases(cap, op=op, **filters)
    if max_cases is not None:
        cases = cases[:max_cases]
    if not cases:
        raise AnalysisError(f"no replayable {op} cases in the capture", key="filters", file=cap.path,
                            fix=f"the adapter needs {ad.op}/{list(ad.names)}; check filters {filters}")
    variants, skipped = [], []
    for b in backends:
        for lab, p in policies.items():
            variants.append((f"{b}:{lab}" if len(backends) > 1 else lab, b, p))
    eo = np.full((len(cases), len(variants)), np.nan)
    ec = np.full(eo.shape, np.nan)
    cap_eo = np.zeros(len(cases))
    for i, c in enumerate(cases):
        x = ad.load(cap, *c)
        ref = ad.run(x, "oracle", Policy(accum_dtype="fp64"))[out]
        captured = cap.get(op=ad.op, rank=c[0], step=c[1], layer=c[2], name=out)
        captured = captured.reshape(ref.shape)
        cap_eo[i] = _rel(captured, ref)
        for j, (lab, b, p) in enumerate(variants):
            try:
                y = ad.run(x, b, p)[out].reshape(ref.shape)
            except (BackendUnavailableError, KernelArgumentError, PolicyError) as e:
                # a backend that cannot run here, or cannot honour a knob: an empty cell, said in attrs
                if not any(x.startswith(f"{lab}:") for x in skipped):
                    skipped.append(f"{lab}: {e.message}")
                continue
            eo[i, j], ec[i, j] = _rel(y, ref), _rel(y, captured)
    labels = [v[0] for v in variants]
    ds = xr.Dataset({"err_oracle": (("case", "variant"), eo), "err_captured": (("case", "variant"), ec),
                     "captured_err_oracle": ("case", cap_eo)},
                    coords={"case": np.arange(len(cases)), "rank": ("case", [c[0] for c in cases]),
                            "step": ("case", [c[1] for c in cases]), "layer": ("case", [c[2] for c in cases]),
                            "variant": labels, "backend": ("variant", [v[1] for v in variants]),
                            "policy": ("variant", [v[2].label() for v in variants])})
    ds["closer"] = ds.err_oracle < ds.captured_err_oracle
    ds["n_closer"] = ds.closer.sum("case")
    ds.attrs.update(analysis="replay", op=op, output=out, capture=str(cap.path), arm=cap.arm,
                    n_cases=len(cases), metric="relative L2", oracle="the op's 'oracle' backend (fp64) on the same inputs",
                    closer="err_oracle < captured_err_oracle (strictly)", skipped="; ".join(skipped) or "none")
    return ds


def counterfactuals(capture, *, op: str, base: Policy | dict | None = None,
                    knobs: Mapping[str, Sequence] | None = None, backend: str = "torch",
                    output: str | None = None, max_cases: int | None = None, **filters) -> xr.Dataset:
    """Change one policy knob at a time and attribute the error (vs FP64) to each knob.

    Parameters
    ----------
    base: the policy of the run (default ``Policy()``)
    knobs: ``{knob: [values]}``, e.g. ``{"state_dtype": ["bf16", "fp16"]}`` (default, for gdn:
        state_dtype bf16, input_dtype bf16; for qsa: prob_dtype fp16, num_kv_splits 4)
    other arguments: as in :func:`replay`

    Returns
    -------
    xarray.Dataset with dims ``case`` and ``change`` (``"base"`` then ``"knob=value"``):
    ``err_oracle``; ``delta`` (mean error of the change minus that of the base), ``share``
    (delta over the sum of positive deltas: the fraction of the added error due to that knob),
    ``knob[change]``, ``value[change]``.

    Example
    -------
    >>> ds = counterfactuals(cap, op="gdn", knobs={"state_dtype": ["bf16"]})    # doctest: +SKIP
    >>> ds.delta.sel(change="state_dtype=bf16") > 0                             # doctest: +SKIP
    """
    b = resolve_policy(base) if base is not None else Policy()
    if knobs is None:
        knobs = ({"state_dtype": ["bf16"], "input_dtype": ["bf16"]} if op == "gdn"
                 else {"prob_dtype": ["fp16"], "num_kv_splits": [4]})
    pols = {"base": b}
    meta = [("", "")]
    for k, vals in knobs.items():
        for v in vals:
            pols[f"{k}={v}"] = b.replace(**{k: v})
            meta.append((k, str(v)))
    ds = replay(capture, op=op, backends=(backend,), policies=pols, output=output, max_cases=max_cases, **filters)
    ds = ds.rename(variant="change")
    mean = ds.err_oracle.mean("case")
    ds["delta"] = mean - mean.sel(change="base")
    pos = float(ds.delta.clip(min=0).sum())
    ds["share"] = ds.delta.clip(min=0) / pos if pos > 0 else ds.delta * 0
    ds = ds.assign_coords(knob=("change", [m[0] for m in meta]), value=("change", [m[1] for m in meta]))
    ds.attrs.update(analysis="counterfactuals", base=b.label(), backend=backend,
                    attribution="delta = mean err_oracle(change) - mean err_oracle(base); share = delta+ / sum delta+")
    return ds
