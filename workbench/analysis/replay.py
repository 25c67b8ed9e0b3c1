"""Same-input replay: run an op's captured inputs through chosen backends and numerics policies,
and judge every result against the FP64 oracle and against the captured output.

Captured tensor names are the business of whoever wrote the capture, so the map from them to
kernel arguments is a plugin: an :class:`OpAdapter` registered under a name
(:func:`register_adapter`, or the ``workbench.replay_adapters`` entry-point group), listed by
:func:`adapters`. The bundled hybrid decoder registers ``gdn``, ``qsa_merge`` and ``qsa`` for
the names it writes (``workbench.models.hybrid_replay``); an engine's importer or a user's model
registers its own. Nothing here knows any model's tensor names.

A *case* is one (rank, step, layer) key of the op. Variants are ``backend x policy``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np
import xarray as xr

from workbench.capture.reader import Capture, open_capture
from workbench.errors import AnalysisError, BackendUnavailableError, KernelArgumentError, PolicyError
from workbench.numerics.metrics import compare
from workbench.numerics.policy import Policy, resolve_policy
from workbench.kernels.registry import kernel_log, resolve_device, to_device
from workbench.plugins import Registry

__all__ = ["OpAdapter", "register_adapter", "adapters", "replay", "counterfactuals", "describe_counterfactuals", "replay_cases",
           "timings_table", "REGISTRY"]


@dataclass(frozen=True)
class OpAdapter:
    """How a captured op becomes kernel calls.

    Attributes
    ----------
    op: the capture's op name; names: the captured input names (the first one finds the cases);
    outputs: the output names (the first is judged by default)
    load: ``load(capture, rank, step, layer) -> dict | None`` of kernel inputs (None: skip case)
    run: ``run(inputs, backend, policy) -> {output name: tensor}``; backend ``"oracle"`` with an
        fp64 policy is the reference
    knobs: the default ``{knob: [values]}`` of :func:`counterfactuals` for this op
    for_op: ``for_op(name) -> OpAdapter``, the same adapter for captures that call the op
        ``name`` (None: the adapter reads ``op`` only)
    """

    op: str
    names: tuple[str, ...]
    outputs: tuple[str, ...]
    load: Callable
    run: Callable
    knobs: Mapping[str, Sequence] | None = None
    for_op: Callable[[str], "OpAdapter"] | None = None


def _check_adapter(obj) -> str | None:
    return None if isinstance(obj, OpAdapter) else "not an OpAdapter"


REGISTRY = Registry("replay adapter", "workbench.replay_adapters", check=_check_adapter, error=AnalysisError)
# the bundled model's adapters are built in: registered here too, so that they exist where the
# package runs from a checkout without installed metadata (entry points need an installed
# distribution); the entry points of the same names and targets are then the same entries
for _name in ("gdn", "gdn_chunked", "qsa_merge", "qsa"):
    REGISTRY.register(_name, f"workbench.models.hybrid_replay:{_name.upper()}", source="builtin")


def register_adapter(name: str, adapter: OpAdapter | str, *, replace: bool = True) -> None:
    """Register ``adapter`` (an :class:`OpAdapter` or a ``"module:attr"`` path) as replay op ``name``.

    Example
    -------
    >>> ad = OpAdapter("attn", ("q", "k", "v"), ("output",), load=my_load, run=my_run)   # doctest: +SKIP
    >>> register_adapter("my_attn", ad)                                                # doctest: +SKIP
    >>> replay(cap, op="my_attn", backends=("torch",))                                 # doctest: +SKIP
    """
    REGISTRY.register(name, adapter, replace=replace)


def adapters() -> list[str]:
    """The names of the registered replay adapters (those :func:`replay`'s ``op=`` accepts)."""
    return REGISTRY.names()


def _adapter(op: str, capture_op: str | None = None) -> OpAdapter:
    if op not in REGISTRY:
        raise AnalysisError(f"no replay adapter for op {op!r}; must be one of {adapters()}", key="op",
                            fix=f"use one of {adapters()}, or register_adapter({op!r}, OpAdapter(...)) for the "
                                "tensor names your capture holds")
    ad = REGISTRY.load(op)
    if capture_op and capture_op != ad.op:
        if ad.for_op is None:
            raise AnalysisError(f"replay adapter {op!r} reads the op {ad.op!r} only, not {capture_op!r}", key="capture_op",
                                fix="register an adapter for your capture's names (register_adapter)")
        ad = ad.for_op(capture_op)
    return ad


def replay_cases(capture, *, op: str, capture_op: str | None = None, **filters) -> list[tuple[int, int, int]]:
    """The (rank, step, layer) cases of ``op`` whose inputs the adapter can load."""
    cap = capture if isinstance(capture, Capture) else open_capture(capture)
    ad = _adapter(op, capture_op)
    idx = cap.select(op=ad.op, name=ad.names[0], **filters).index
    cases = sorted({(int(r), int(s), int(l)) for r, s, l in idx[["rank", "step", "layer"]].itertuples(index=False)})
    return [c for c in cases if ad.load(cap, *c) is not None]


def _label(backend: str, policy: Policy, many_backends: bool) -> str:
    return f"{backend}:{policy.label()}" if many_backends else policy.label()


def _rel(a, ref) -> float:
    return float(compare(ref.double(), a.double()).rel_l2)


def replay(capture, *, op: str, backends: Sequence[str] = ("torch",), policies: Sequence | Mapping | None = None,
           output: str | None = None, max_cases: int | None = None, capture_op: str | None = None,
           client=None, device: str | None = None, **filters) -> xr.Dataset:
    """Replay an op's captured inputs through ``backends x policies``.

    Parameters
    ----------
    capture: the capture (or path) holding the inputs and the captured (control) outputs
    op: a registered replay adapter (:func:`adapters`; the bundled model's: "gdn", "gdn_chunked",
        "qsa_merge", "qsa")
    backends: kernel backends (one that cannot run here is skipped and listed in attrs)
    policies: Policies or knob dicts, or ``{label: policy}`` (default: the fp32 ``Policy()``)
    output: the output to judge (default the adapter's first: ``core``, ``o``)
    max_cases: replay at most this many cases (in order)
    capture_op: the capture's name of the op when it differs from the adapter's (e.g. an engine's
        ``linear_attn`` holding the bundled ``gdn`` adapter's tensor names)
    client: a ``dask.distributed.Client``: the cases are replayed in chunks on its workers (each
        runs the backends it has: with dask-cuda's ``LocalCUDACluster``, one GPU per worker); the
        dataset is the one a local run gives
    device: where the backends run: None (the captured tensors' device, the CPU), "auto" (the GPU
        when there is one), "cpu", "cuda"; the inputs are moved there, the FP64 oracle and the
        errors stay on the CPU. A backend that cannot take that device is skipped with the reason
    filters: restrict the cases (``layer=``, ``step=``, ``rank=``)

    Returns
    -------
    xarray.Dataset with dims ``case`` (coords rank, step, layer) and ``variant``:
    ``err_oracle`` (relative L2 vs the FP64 oracle on the same inputs), ``err_captured`` (vs the
    captured output), ``captured_err_oracle[case]`` (the captured output vs the oracle),
    ``closer[case, variant]`` (strictly closer to FP64 than the captured output) and
    ``n_closer[variant]`` (in how many of the N cases), ``n_run[variant]`` (cases the variant
    ran). A variant a backend cannot run is NaN, has ``n_run`` 0 and is named in attrs ``skipped``
    (and ``skipped_variants``, a JSON list of "label: reason").
    attrs ``device`` says where the backends ran and ``timings`` (JSON, one record per op, backend
    and device: calls, ``one_time_s`` the first calls' JIT/build cost, ``kernel_s`` the median
    call after it) separates the one-time cost from the kernel time.

    Example
    -------
    >>> ds = replay("captures/control", op="gdn", policies=[Policy(), Policy(state_dtype="bf16")],
    ...             layer=0)                                                      # doctest: +SKIP
    >>> ds.n_closer.to_series()                                                  # doctest: +SKIP
    """
    cap = capture if isinstance(capture, Capture) else open_capture(capture)
    ad = _adapter(op, capture_op)
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
    cases = replay_cases(cap, op=op, capture_op=capture_op, **filters)
    if max_cases is not None:
        cases = cases[:max_cases]
    if not cases:
        raise AnalysisError(f"no replayable {op} cases in the capture", key="filters", file=cap.path,
                            fix=f"the adapter needs {ad.op}/{list(ad.names)}; check filters {filters}")
    variants = []
    for b in backends:
        for lab, p in policies.items():
            variants.append((f"{b}:{lab}" if len(backends) > 1 else lab, b, p))
    if client is not None:
        from workbench.analysis.distributed import replay_on

        parts = replay_on(client, cap, op, capture_op, out, variants, cases, device=device)
        where = str(device or "cpu")
    else:
        dev = resolve_device(device) if device is not None else None
        parts = [_replay_cases(cap, op, capture_op, out, variants, cases, device=dev)]
        where = str(dev or "cpu")
    eo = np.concatenate([p[0] for p in parts])
    ec = np.concatenate([p[1] for p in parts])
    cap_eo = np.concatenate([p[2] for p in parts])
    skipped, seen = [], set()
    for p in parts:  # one reason per variant label, the first task's
        for x in p[3]:
            lab = next((v[0] for v in variants if x.startswith(f"{v[0]}: ")), x)
            if lab not in seen:
                seen.add(lab)
                skipped.append(x)
    calls: dict = {}
    for p in parts:  # the kernel logs of every task, calls added up
        for rec in p[4]:
            k = tuple(sorted((a, str(b)) for a, b in rec.items() if a != "calls"))
            calls[k] = calls.get(k, 0) + int(rec.get("calls", 1))
    log_summary = [{**dict(k), "calls": c} for k, c in calls.items()]
    timings = _merge_timings([t for p in parts for t in p[5]])
    labels = [v[0] for v in variants]
    ds = xr.Dataset({"err_oracle": (("case", "variant"), eo), "err_captured": (("case", "variant"), ec),
                     "captured_err_oracle": ("case", cap_eo)},
                    coords={"case": np.arange(len(cases)), "rank": ("case", [c[0] for c in cases]),
                            "step": ("case", [c[1] for c in cases]), "layer": ("case", [c[2] for c in cases]),
                            "variant": labels, "backend": ("variant", [v[1] for v in variants]),
                            "policy": ("variant", [v[2].label() for v in variants])})
    ds["closer"] = ds.err_oracle < ds.captured_err_oracle
    ds["n_closer"] = ds.closer.sum("case")
    ds["n_run"] = ds.err_oracle.notnull().sum("case")  # 0: the variant was skipped, not "never closer"
    ds.attrs.update(analysis="replay", op=op, output=out, capture=str(cap.path), arm=cap.arm,
                    n_cases=len(cases), metric="relative L2", oracle="the op's 'oracle' backend (fp64) on the same inputs",
                    closer="err_oracle < captured_err_oracle (strictly)", skipped="; ".join(skipped) or "none",
                    skipped_variants=json.dumps(skipped),
                    kernels=json.dumps(log_summary), device=where, timings=json.dumps(timings))
    return ds


def _merge_timings(records: list[dict]) -> list[dict]:
    """The kernel timings of several tasks as one record per (family, op, backend, device): calls
    and one-time costs added up (each worker pays its own JIT), the kernel time the median of the
    tasks' medians."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["family"], r["op"], r["backend"], r["device"]), []).append(r)
    out = []
    for (fam, op, be, dev), rs in groups.items():
        ks = [r["kernel_s"] for r in rs if r["kernel_s"] == r["kernel_s"]]
        out.append(dict(family=fam, op=op, backend=be, device=dev, calls=sum(r["calls"] for r in rs),
                        first_calls=sum(r["first_calls"] for r in rs), kernel_s=float(np.median(ks)) if ks else float("nan"),
                        one_time_s=sum(r["one_time_s"] for r in rs), total_s=sum(r["total_s"] for r in rs)))
    return out


def timings_table(ds):
    """The kernel timings a replay recorded (attrs ``timings``) as a DataFrame: backend, op, device,
    calls, the one-time JIT/build cost and the median kernel time in ms, slowest first."""
    import pandas as pd
    rows = json.loads(ds.attrs.get("timings", "[]"))
    df = pd.DataFrame(rows, columns=["family", "op", "backend", "device", "calls", "first_calls", "kernel_s",
                                     "one_time_s", "total_s"])
    df["kernel_ms"] = df.pop("kernel_s") * 1e3
    return df.sort_values("total_s", ascending=False, ignore_index=True)


def counterfactuals(capture, *, op: str, base: Policy | dict | None = None,
                    knobs: Mapping[str, Sequence] | None = None, backend: str = "torch",
                    output: str | None = None, max_cases: int | None = None, capture_op: str | None = None,
                    device: str | None = None, **filters) -> xr.Dataset:
    """Change one policy knob at a time and attribute the error (vs FP64) to each knob.

    Parameters
    ----------
    base: the policy of the run (default ``Policy()``)
    knobs: ``{knob: [values]}``, e.g. ``{"state_dtype": ["bf16", "fp16"]}`` (default: the
        adapter's ``knobs``)
    other arguments: as in :func:`replay`

    Returns
    -------
    xarray.Dataset with dims ``case`` and ``change`` (``"base"`` then ``"knob=value"``):
    ``err_oracle``, ``mean_err_oracle[change]`` (over the cases); ``delta`` (mean error of the
    change minus that of the base), ``share``
    (delta over the sum of positive deltas: the fraction of the added error due to that knob),
    ``knob[change]``, ``value[change]``; ``mean_err_captured[change]`` (vs the captured output)
    and attrs ``reproduced_by`` (the change whose replay is closest to the captured output: which
    policy the captured run behaves like, found from the tensors); ``median_err_captured[change]``,
    ``n_closer_captured[change]`` (in how many cases the change's replay is strictly closer to the
    captured output than the base's: "moves k of N cases closer") and ``median_err_oracle``.
    :func:`describe_counterfactuals` says it in a line per change.

    Example
    -------
    >>> ds = counterfactuals(cap, op="gdn", knobs={"state_dtype": ["bf16"]})    # doctest: +SKIP
    >>> ds.delta.sel(change="state_dtype=bf16") > 0                             # doctest: +SKIP
    """
    b = resolve_policy(base) if base is not None else Policy()
    if knobs is None:
        knobs = _adapter(op).knobs
        if not knobs:
            raise AnalysisError(f"replay adapter {op!r} names no default knobs", key="knobs",
                                fix="pass knobs={'state_dtype': ['bf16']} (policy knob -> values)")
    pols = {"base": b}
    meta = [("", "")]
    for k, vals in knobs.items():
        for v in vals:
            pols[f"{k}={v}"] = b.replace(**{k: v})
            meta.append((k, str(v)))
    ds = replay(capture, op=op, backends=(backend,), policies=pols, output=output, max_cases=max_cases,
                capture_op=capture_op, device=device, **filters)
    ds = ds.rename(variant="change")
    ds["mean_err_captured"] = ds.err_captured.mean("case")
    ds["median_err_captured"] = ds.err_captured.median("case")
    ds["median_err_oracle"] = ds.err_oracle.median("case")
    ds["n_closer_captured"] = (ds.err_captured < ds.err_captured.sel(change="base")).sum("case")
    mean = ds.err_oracle.mean("case")
    ds["mean_err_oracle"] = mean
    ds["delta"] = mean - mean.sel(change="base")
    pos = float(ds.delta.clip(min=0).sum())
    ds["share"] = ds.delta.clip(min=0) / pos if pos > 0 else ds.delta * 0
    ds = ds.assign_coords(knob=("change", [m[0] for m in meta]), value=("change", [m[1] for m in meta]))
    ran = ds.mean_err_captured.notnull()
    ds.attrs.update(analysis="counterfactuals", base=b.label(), backend=backend,
                    reproduced_by=str(ds.change[ran].values[int(np.argmin(ds.mean_err_captured[ran].values))]) if ran.any() else "none",
                    attribution="delta = mean err_oracle(change) - mean err_oracle(base); share = delta+ / sum delta+")
    return ds


def _replay_cases(cap, op, capture_op, out, variants, cases, device=None):
    """Replay ``cases`` through ``variants`` ((label, backend, policy)): the errors against the
    oracle and the captured output, the captured output's error, the variants skipped (with the
    reason), the kernel log's summary and its timings. ``device``: where the variants run (a
    spec is resolved here, on the worker; None: the captured tensors' device)."""
    if device is not None and not hasattr(device, "type"):
        device = resolve_device(device)
    ad = _adapter(op, capture_op)
    eo = np.full((len(cases), len(variants)), np.nan)
    ec = np.full(eo.shape, np.nan)
    cap_eo = np.zeros(len(cases))
    skipped: list[str] = []
    with kernel_log(timing=True) as log:  # which backend and code path computed each variant, in attrs
        for i, c in enumerate(cases):
            x = ad.load(cap, *c)
            xd = to_device(x, device) if device is not None else x
            ref = ad.run(x, "oracle", Policy(accum_dtype="fp64"))[out]
            captured = cap.get(op=ad.op, rank=c[0], step=c[1], layer=c[2], name=out)
            captured = captured.reshape(ref.shape)
            cap_eo[i] = _rel(captured, ref)
            for j, (lab, b, p) in enumerate(variants):
                try:
                    y = ad.run(xd, b, p)[out].cpu().reshape(ref.shape)
                except (BackendUnavailableError, KernelArgumentError, PolicyError) as e:
                    # a backend that cannot run here, or cannot honour a knob: an empty cell, said in attrs
                    if not any(x.startswith(f"{lab}:") for x in skipped):
                        skipped.append(f"{lab}: {e.message}")
                    continue
                eo[i, j], ec[i, j] = _rel(y, ref), _rel(y, captured)
    return eo, ec, cap_eo, skipped, log.summary(), log.timings()


def describe_counterfactuals(cf: xr.Dataset) -> list[str]:
    """A line per change of :func:`counterfactuals`: in how many of the N cases its replay is closer
    to the captured output than the base policy's, and the median relative L2 against the captured
    output and against FP64, base -> change.

    Example
    -------
    >>> for line in describe_counterfactuals(cf): print(line)                   # doctest: +SKIP
    prob_dtype=fp16: closer to the captured o in 36 of 36 cases; median rel. L2 vs captured 1.276e-04 -> 3.820e-05, vs FP64 ...
    """
    n = cf.sizes["case"]
    out = cf.attrs.get("output", "output")
    b_cap = float(cf.median_err_captured.sel(change="base"))
    b_fp64 = float(cf.median_err_oracle.sel(change="base"))
    lines = [f"base ({cf.attrs.get('base', 'base')}): median rel. L2 vs captured {b_cap:.3e}, vs FP64 {b_fp64:.3e} "
             f"over {n} case(s)"]
    for ch in cf.change.values[1:]:
        c = cf.sel(change=ch)
        if bool(np.isnan(c.err_captured).all()):
            lines.append(f"{ch}: not run ({cf.attrs.get('skipped', 'skipped')})")
            continue
        lines.append(f"{ch}: closer to the captured {out} in {int(c.n_closer_captured)} of {n} cases; median rel. L2 "
                     f"vs captured {b_cap:.3e} -> {float(c.median_err_captured):.3e}, vs FP64 {b_fp64:.3e} -> "
                     f"{float(c.median_err_oracle):.3e}")
    return lines
