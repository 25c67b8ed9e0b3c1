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
from workbench.errors import KernelArgumentError
from workbench.kernels.gemm import splitk_matmul
from workbench.kernels.gemm.oracle import splitk_matmul as exact_matmul
from workbench.kernels.sampling import greedy
from workbench.numerics.dtypes import canonical, round_to
from workbench.numerics.metrics import compare

__all__ = ["splitk_sweep", "splitk_sweep_capture", "splitk_findings", "CONTROL"]

CONTROL = {"splits": 1, "partial_dtype": "fp32", "order": "sequential"}


def _tokens(y, logits_dtype) -> np.ndarray:
    v = y.double() if logits_dtype is None else torch.from_numpy(round_to(y, logits_dtype))
    return greedy(v).numpy()


def splitk_sweep(x: torch.Tensor, w: torch.Tensor, *, splits: Sequence[int] = range(1, 33),
                 partial_dtypes: Sequence[str] = ("fp32", "bf16", "fp16"),
                 orders: Sequence[str] = ("sequential", "tree"), control: dict | None = None,
                 out_dtype: str = "fp32", logits_dtype: str | None = "bf16", backend: str = "torch",
                 ulp_dtype: str | None = None) -> xr.Dataset:
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
    y_ctl = splitk_matmul(x, w, out_dtype=out_dtype, backend=backend, **ctl)
    tok_ctl = _tokens(y_ctl, logits_dtype)
    M = x.shape[0]
    shape = (len(splits), len(pds), len(orders))
    rel, mx, mu = np.zeros(shape), np.zeros(shape), np.zeros(shape, dtype=np.int64)
    tok = np.zeros((*shape, M), dtype=np.int64)
    for i, s in enumerate(splits):
        for j, p in enumerate(pds):
            for k, o in enumerate(orders):
                y = splitk_matmul(x, w, splits=s, partial_dtype=p, order=o, out_dtype=out_dtype, backend=backend)
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
        backend=backend, out_dtype=canonical(out_dtype), logits_dtype=logits_dtype or "as computed",
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
