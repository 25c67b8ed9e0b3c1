"""Split-K sweep: which (splits, partial dtype, reduction order) configurations of a projection
change the chosen token, and whether the cause is the storage dtype of the partial sums.

Every configuration runs through :func:`workbench.kernels.gemm.splitk_matmul` and is judged
against the exact FP64 product (the gemm oracle with unrounded partials) with
:func:`workbench.numerics.metrics.compare`. Tokens are greedy (first maximum) over each output row
after materializing it in ``logits_dtype``.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import xarray as xr

from workbench.capture.reader import Capture, open_capture
from workbench.errors import BackendUnavailableError, KernelArgumentError
from workbench.kernels.gemm import splitk_matmul
from workbench.kernels.registry import placed, runnable
from workbench.kernels.gemm.oracle import splitk_matmul as exact_matmul
from workbench.kernels.sampling import greedy
from workbench.numerics.dtypes import canonical, round_to
from workbench.numerics.metrics import compare

__all__ = ["splitk_explain", "splitk_sweep", "splitk_sweep_capture", "splitk_findings", "splitk_model_sweep", "CONTROL"]

CONTROL = {"splits": 1, "partial_dtype": "fp32", "order": "sequential"}


def _tokens(y, logits_dtype) -> np.ndarray:
    v = y.double() if logits_dtype is None else torch.from_numpy(round_to(y, logits_dtype))
    return greedy(v).numpy()


def splitk_sweep(x: torch.Tensor, w: torch.Tensor, *, splits: Sequence[int] = range(1, 33),
                 partial_dtypes: Sequence[str] = ("fp32", "bf16", "fp16"),
                 orders: Sequence[str] = ("sequential", "tree"), control: dict | None = None,
                 out_dtype: str = "fp32", logits_dtype: str | None = "bf16", backend: str = "torch",
                 ulp_dtype: str | None = None, device=None) -> xr.Dataset:
    """Run a projection under every split-K configuration; report error and token flips as a grid.

    Parameters
    ----------
    x: ``[M, K]`` fp32/bf16/fp16 activations (e.g. the hidden states entering lm_head)
    w: ``[N, K]`` weight in x's dtype (``nn.Linear`` layout)
    splits: split counts to sweep (each in ``1..K``)
    partial_dtypes: storage dtypes of the partial sums ("fp32", "bf16", "fp16")
    orders: reduction orders ("sequential", "tree")
    control: the configuration the engine normally runs (default ``CONTROL``: one split, fp32)
    out_dtype: dtype of the GEMM output
    logits_dtype: dtype the outputs are materialized in before greedy (None: as computed)
    backend: gemm backend ("torch", "ext", "numba", ...)
    ulp_dtype: format of the ULP counts (default ``out_dtype``)
    device: where the backend runs (None: x's device; "auto": the GPU when there is one; "cpu",
        "cuda"): x and w are moved there, the FP64 product and the metrics stay on the CPU. A
        backend that cannot take that device is a BackendUnavailableError (before any work)

    Returns
    -------
    xarray.Dataset with dims ``splits``, ``partial_dtype``, ``order``, ``row``:
    ``rel_l2``, ``max_abs``, ``max_ulp`` (vs the FP64 product), ``token[..., row]``,
    ``flip_fp64[..., row]`` (token differs from the FP64 choice), ``flip_control[..., row]``,
    ``fails`` (any row flips against FP64), ``fails_control``, ``partial_cause`` (fails while the
    same splits and order with fp32 partials do not: the storage dtype of the partials is the
    cause), ``n_fail[partial_dtype, order]``; ``token_fp64[row]``, ``token_control[row]``.

    Example
    -------
    >>> x, w = torch.randn(1, 256), torch.randn(64, 256)
    >>> ds = splitk_sweep(x, w, splits=[1, 2, 4], partial_dtypes=["fp32", "bf16"], orders=["sequential"])
    >>> ds.fails.dims
    ('splits', 'partial_dtype', 'order')
    >>> print(splitk_findings(ds)[0])                                    # doctest: +SKIP
    """
    for name, t in (("x", x), ("w", w)):
        if not isinstance(t, torch.Tensor) or t.dim() != 2:
            raise KernelArgumentError(f"{name} must be a 2-D tensor, got {getattr(t, 'shape', type(t).__name__)}",
                                      key=name, fix="pass x [M, K] and w [N, K]; flatten leading dims into M")
    splits = [int(s) for s in splits]
    pds = [canonical(p) for p in partial_dtypes]
    orders = list(orders)
    if not splits or not pds or not orders:
        raise KernelArgumentError("splits, partial_dtypes and orders must each be non-empty", key="splits",
                                  fix="pass e.g. splits=range(1, 33)")
    ctl = dict(CONTROL, **(control or {}))
    ulp = canonical(ulp_dtype or out_dtype)
    exact = exact_matmul(x, w, splits=1, partial_dtype=None)
    tok64 = _tokens(exact, logits_dtype)
    dev, (xd, wd) = placed(device, x, w)
    _, why = runnable("gemm", [backend], dev)
    if why:
        raise BackendUnavailableError(f"gemm backend {backend!r} {why[backend]}", key="backend",
                                      fix="pick a backend of workbench.kernels.backends('gemm') that runs on "
                                          f"{dev.type}, or another device")
    y_ctl = splitk_matmul(xd, wd, out_dtype=out_dtype, backend=backend, **ctl).cpu()
    tok_ctl = _tokens(y_ctl, logits_dtype)
    M = x.shape[0]
    shape = (len(splits), len(pds), len(orders))
    rel, mx, mu = np.zeros(shape), np.zeros(shape), np.zeros(shape, dtype=np.int64)
    tok = np.zeros((*shape, M), dtype=np.int64)
    for i, s in enumerate(splits):
        for j, p in enumerate(pds):
            for k, o in enumerate(orders):
                y = splitk_matmul(xd, wd, splits=s, partial_dtype=p, order=o, out_dtype=out_dtype,
                                  backend=backend).cpu()
                c = compare(exact, y, dtype=ulp)
                rel[i, j, k], mx[i, j, k], mu[i, j, k] = c.rel_l2, c.max_abs, c.max_ulp
                tok[i, j, k] = _tokens(y, logits_dtype)
    dims = ("splits", "partial_dtype", "order")
    flip64 = tok != tok64
    flipc = tok != tok_ctl
    fails = flip64.any(-1)
    ds = xr.Dataset(
        {
            "rel_l2": (dims, rel), "max_abs": (dims, mx), "max_ulp": (dims, mu),
            "token": ((*dims, "row"), tok),
            "flip_fp64": ((*dims, "row"), flip64), "flip_control": ((*dims, "row"), flipc),
            "fails": (dims, fails), "fails_control": (dims, flipc.any(-1)),
            "token_fp64": ("row", tok64), "token_control": ("row", tok_ctl),
        },
        coords={"splits": splits, "partial_dtype": pds, "order": orders, "row": np.arange(M)},
    )
    if "fp32" in pds:
        ref = ds.fails.sel(partial_dtype="fp32")
        ds["partial_cause"] = ds.fails & ~ref & (ds.partial_dtype != "fp32")
    else:
        ds["partial_cause"] = xr.zeros_like(ds.fails)
    ds["n_fail"] = ds.fails.sum("splits")
    ds["rel_l2"].attrs["units"] = "relative L2 vs the exact FP64 product"
    ds["max_ulp"].attrs["units"] = f"{ulp} ULP"
    ds.attrs.update(
        analysis="splitk_sweep", oracle="exact FP64 product (gemm oracle, unrounded partials)",
        backend=backend, device=str(dev), out_dtype=canonical(out_dtype), logits_dtype=logits_dtype or "as computed",
        token_rule="greedy, first maximum", control=str(ctl), shape_x=str(list(x.shape)),
        shape_w=str(list(w.shape)), x_dtype=canonical(x.dtype),
        fails="the chosen token of some row differs from the FP64 choice",
        partial_cause="fails with these partials but not with fp32 partials at the same splits and order",
    )
    return ds


def splitk_sweep_capture(capture, *, weight=None, op: str = "lm_head", input_name: str = "input",
                         weight_name: str = "weight", step: int = 0, rank: int = 0, layer: int | None = None,
                         position: int | None = -1, **kwargs) -> xr.Dataset:
    """:func:`splitk_sweep` of a captured projection: its input ``[..., K]`` at one step, and
    its weight from ``weight=`` or the capture's ``op/weight_name`` tensor.

    ``position`` picks one row of the input's second-to-last dim (-1: the sampled position;
    None: every row).

    Example
    -------
    >>> ds = splitk_sweep_capture("captures/splitk", weight=w, splits=range(1, 33))   # doctest: +SKIP
    """
    cap = capture if isinstance(capture, Capture) else open_capture(capture)
    key = dict(op=op, step=step, rank=rank)
    if layer is not None:
        key["layer"] = layer
    x = cap.get(name=input_name, **key)
    if weight is None:
        wv = cap.select(name=weight_name, **{k: v for k, v in key.items() if k != "step"})
        if len(wv) == 0:
            raise KernelArgumentError(
                f"the capture has no {op}/{weight_name} tensor and no weight= was given", key="weight",
                fix="pass weight= (the projection's nn.Linear weight [N, K])")
        weight = wv._tensor(wv.index.iloc[0])
    x2 = x.reshape(-1, x.shape[-1])
    if position is not None:
        x2 = x.reshape(-1, x.shape[-2] if x.dim() >= 2 else 1, x.shape[-1])[:, position]
    w = weight.to(x2.dtype) if weight.dtype != x2.dtype else weight
    ds = splitk_sweep(x2.contiguous(), w.contiguous(), **kwargs)
    ds.attrs.update(capture=str(cap.path), arm=cap.arm, key=str(key), input_name=input_name)
    return ds


def _ranges(vals: list[int]) -> str:
    out, i = [], 0
    while i < len(vals):
        j = i
        while j + 1 < len(vals) and vals[j + 1] == vals[j] + 1:
            j += 1
        out.append(str(vals[i]) if i == j else f"{vals[i]}-{vals[j]}")
        i = j + 1
    return ", ".join(out)


def splitk_findings(ds: xr.Dataset) -> list[str]:
    """Plain sentences summarizing a :func:`splitk_sweep` grid, one per (partial dtype, order).

    Example: ``"bf16 partials, sequential: 9 of 25 split counts change the token (3, 5-7, ...),
    16 pass; with fp32 partials all pass: the cause is the partials stored in bf16"``.
    """
    lines = []
    n = ds.sizes["splits"]
    for p in ds.partial_dtype.values:
        for o in ds.order.values:
            f = ds.fails.sel(partial_dtype=p, order=o).values
            bad = [int(s) for s in ds.splits.values[f]]
            text = f"{p} partials, {o}: {len(bad)} of {n} split counts change the token vs FP64"
            text += f" ({_ranges(bad)}), {n - len(bad)} pass" if bad else ", all pass"
            if bad and p != "fp32" and "fp32" in ds.partial_dtype.values:
                ref = ds.fails.sel(partial_dtype="fp32", order=o).values
                cause = ds.partial_cause.sel(partial_dtype=p, order=o).values
                if not ref[f].any():
                    text += f"; with fp32 partials all of these pass: the cause is the partials stored in {p}"
                elif cause.any():
                    text += (f"; {int(cause.sum())} of them pass with fp32 partials (partials stored in {p}), "
                             f"{int(ref[f].sum())} fail in fp32 too (reassociation)")
            lines.append(text)
    return lines


def splitk_explain(control, candidate=None, *, logits: str | None = None, tokens: str | None = None,
                   hidden: str | None = None, weight=None, step: int | None = None,
                   logits_dtype: str | None = None, **sweep) -> xr.Dataset:
    """Sweep the control's lm_head at the step that matters and say which configurations give
    each arm's token; found from the tensors.

    The logits, sampled tokens, lm_head input and weight are detected (or named as in
    :func:`workbench.analysis.logits.logit_ties`; ``weight`` may be ``"file.safetensors:tensor"``).
    ``step=None`` takes the first step whose tokens differ (else step 0 of the compared steps);
    ``logits_dtype=None`` the control's captured logits dtype (what its sampler saw). Other keyword
    arguments go to :func:`splitk_sweep`.

    Returns
    -------
    the :func:`splitk_sweep` Dataset, plus ``reproduces_control`` / ``reproduces_candidate``
    (``[splits, partial_dtype, order]``: the configuration's greedy token is the arm's token at
    that step); attrs ``step``, ``step_reason``, ``tokens`` (each arm's token there),
    ``findings`` (sentences).
    """
    from workbench.analysis.logits import _arm_logits, _open
    from workbench.analysis.tokens import find_hidden, first_rank, load_weight, parse_tensor, token_agreement
    from workbench.numerics.dtypes import canonical

    ctl = _open(control)
    cand = _open(candidate) if candidate is not None else None
    spec, rows, steps = _arm_logits(ctl, logits)
    first, source = -1, None
    if cand is not None:
        agree = token_agreement(ctl, cand, tokens=tokens, logits=logits)
        first, source = int(agree.attrs["first_differing_step"]), agree.attrs["source"]
    if step is not None:
        at, reason = int(step), "the step asked for"
    elif first >= 0:
        at, reason = first, "the first step whose tokens differ"
    else:
        at, reason = int(steps[0]), ("the first step (the arms' tokens agree)" if cand is not None else
                                     "the first step (no candidate)")
    h_spec = parse_tensor(hidden, "hidden") if hidden else find_hidden(ctl, spec)
    if h_spec is None:
        raise KernelArgumentError(f"{ctl.path} holds no lm_head input next to {'/'.join(spec)}: nothing to sweep",
                                  key="hidden", fix="record the lm_head's input, or name it with hidden='op/name'")
    rank = first_rank(ctl, *h_spec)
    x = ctl.get(op=h_spec[0], name=h_spec[1], step=at, rank=rank, layer=-1)
    w, where = load_weight(ctl, weight, vocab=int(rows.shape[-1]), hidden=int(x.shape[-1]))
    if w is None:
        raise KernelArgumentError(f"no lm_head weight: {where}", key="weight",
                                  fix="pass weight='path/model.safetensors:lm_head.weight' or 'op/name'")
    ldt = canonical(logits_dtype) if logits_dtype else canonical(rows.dtype)
    x2 = x.reshape(-1, x.shape[-1])[-1:]
    ds = splitk_sweep(x2.contiguous(), w.to(x2.dtype).contiguous(), logits_dtype=ldt, **sweep)
    toks = {}
    for arm, cap in (("control", ctl), ("candidate", cand)):
        if cap is None:
            continue
        if source and "argmax" not in source:
            op, name = source.rsplit("/", 1)
            toks[arm] = int(cap.get(op=op, name=name, step=at, rank=rank, layer=-1).reshape(-1)[-1])
        else:
            s, r, st = _arm_logits(cap, logits)
            toks[arm] = int(r[list(st).index(at)].float().argmax())
        ds[f"reproduces_{arm}"] = ds.token.isel(row=0) == toks[arm]
    exact = int(torch.argmax(x2.double() @ w.double().T, dim=-1)[0])
    picked = int(ds.token_fp64[0])
    lines = [f"step {at} ({reason}): the FP64 product rounded once to {ldt} gives token {picked}"
             + (" (also the unrounded FP64 argmax)" if exact == picked else
                f"; the unrounded FP64 argmax is {exact}: rounding the logits to {ldt} alone changes the token, "
                "whatever the split")]
    lines += splitk_findings(ds)
    for arm, t in toks.items():
        rep = ds[f"reproduces_{arm}"]
        where_ = [f"{p} partials, {o}, splits {_ranges([int(s) for s in ds.splits.values[rep.sel(partial_dtype=p, order=o).values]])}"
                  for p in ds.partial_dtype.values for o in ds.order.values if rep.sel(partial_dtype=p, order=o).any()]
        lines.append(f"the {arm}'s token {t}" + (" (the FP64 pick)" if t == int(ds.token_fp64[0]) else "")
                     + " is reproduced by " + ("; ".join(where_) if where_ else "no swept configuration"))
    ds.attrs.update(step=at, step_reason=reason, tokens=toks, fp64_argmax=exact, token_source=source or "", logits="/".join(spec),
                    hidden="/".join(h_spec), weight_source=where, findings=lines, logits_dtype=ldt)
    return ds


def splitk_model_sweep(model, prompt, *, steps: int, arm=None, reference=None,
                       projections: Sequence[str] = ("gdn.a", "gdn.b"), layers: Sequence[int] | None = None,
                       splits: Sequence[int] = (1, 2, 3, 4, 6, 8), partial_dtype: str = "bf16",
                       phase: str | None = "decode", cause_test: bool = True) -> xr.Dataset:
    """Split-K configurations of chosen projections, swept through the whole model: which flip the
    generated tokens?

    The hybrid decoder generates ``steps`` tokens after ``prompt`` under ``arm`` with every
    projection named in ``projections`` (``PROJECTIONS`` of :mod:`workbench.models.hybrid`, e.g. the
    GDN gate projections ``gdn.a``, ``gdn.b``) on ``layers`` (None: all) in ``phase`` (``"decode"``:
    one-token steps; None: every step) computed as ``splits`` K-slices with ``partial_dtype``
    partials. Tokens are compared with ``reference`` (an ArmConfig run, default ``arm`` itself
    without the sweep): a flip is a differing token. ``arm`` may carry its own differences (a bf16
    recurrent state, a chunked prefill): a split-K configuration often flips a token only on top of
    such a prefill-state difference. The cause test re-runs each flipping configuration with fp32
    partials: if the flip goes away, the bf16 rounding of the partials causes it; if it stays, the
    reassociation of the sum does.

    Returns
    -------
    xarray.Dataset along ``splits``: ``tokens[splits, step]``, ``flips`` (any token differs from the
    reference), ``first_flip`` (step, -1 if none), ``flips_fp32`` (the cause test; False where not
    run), ``cause`` ("bf16 partials", "reassociation" or ""); attrs ``reference_tokens``,
    ``arm_tokens`` (``arm`` without the sweep), ``sentence``.
    """
    from workbench.models.hybrid import PROJECTIONS, ArmConfig, Override

    bad = [p for p in projections if p not in PROJECTIONS]
    if bad or not projections:
        raise KernelArgumentError(f"unknown projection(s) {bad or list(projections)}", key="projections",
                                  fix=f"name projections from {list(PROJECTIONS)}")
    if any((not isinstance(s, int)) or s < 1 for s in splits):
        raise KernelArgumentError(f"splits must be positive ints, got {list(splits)}", key="splits",
                                  fix="pass e.g. splits=(1, 2, 4, 8)")
    arm = arm or ArmConfig(name="sweep")
    lay = None if layers is None else tuple(int(x) for x in layers)

    def run(a):
        return [int(t) for t in model.generate(prompt, steps=steps, arm=a)]

    def swept(s, pd):
        o = Override("proj", {"splitk": int(s), "partial_dtype": pd}, layers=lay, names=tuple(projections), phase=phase)
        return arm.replace(name=f"{arm.name}-splitk{s}-{pd}", overrides=tuple(arm.overrides) + (o,))

    arm_tokens = run(arm)
    ref_tokens = arm_tokens if reference is None else run(reference)
    toks, flips, first, fp32, cause = [], [], [], [], []
    for s in splits:
        t = run(swept(s, partial_dtype))
        diff = [i for i, (a, b) in enumerate(zip(t, ref_tokens)) if a != b]
        toks.append(t)
        flips.append(bool(diff))
        first.append(diff[0] if diff else -1)
        if diff and cause_test and partial_dtype != "fp32":
            t32 = run(swept(s, "fp32"))
            f32 = t32 != ref_tokens
            fp32.append(f32)
            cause.append("reassociation" if f32 else f"{partial_dtype} partials")
        else:
            fp32.append(False)
            cause.append("")
    ds = xr.Dataset(
        {"tokens": (("splits", "step"), np.array(toks, dtype=np.int64)), "flips": ("splits", flips),
         "first_flip": ("splits", np.array(first, dtype=np.int64)), "flips_fp32": ("splits", fp32),
         "cause": ("splits", np.array(cause, dtype=object).astype(str))},
        coords={"splits": list(splits), "step": np.arange(len(ref_tokens))},
    )
    flipping = [int(s) for s, f in zip(splits, flips) if f]
    where = ", ".join(projections) + (f" on layers {list(lay)}" if lay else "") + (f" ({phase} steps)" if phase else "")
    sent = (f"split-K of {where} with {partial_dtype} partials: " +
            (f"{len(flipping)} of {len(splits)} configurations flip a token ({_ranges(flipping)} splits; first flip at "
             f"step {min(f for f in first if f >= 0)})" if flipping else f"none of {len(splits)} configurations flips a token"))
    causes = sorted({c for c in cause if c})
    if causes:
        sent += "; cause: " + ", ".join(f"{c} ({sum(1 for x in cause if x == c)})" for c in causes)
    if reference is not None and arm_tokens != ref_tokens:
        sent += "; the arm alone already differs from the reference"
    elif reference is not None:
        sent += "; the arm alone gives the reference's tokens, so the flips need both"
    ds.attrs.update(analysis="splitk_model_sweep", reference_tokens=ref_tokens, arm_tokens=arm_tokens,
                    projections=list(projections), partial_dtype=partial_dtype, phase=phase or "all",
                    arm=arm.name, sentence=sent)
    return ds
