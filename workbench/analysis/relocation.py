"""Relocation invariance of the paged sparse attention: moving KV pages to other physical slots
(only the block table changes) must not change a single bit of the output.

A kernel that visits tokens in logical (block-table) order is invariant by construction; one that
visits them in physical page order (``Policy.page_order="physical"``) sums in an allocator-
dependent order and cuts its KV splits at allocator-dependent places, a real past defect.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch
import xarray as xr

from workbench.capture.reader import Capture, open_capture
from workbench.errors import AnalysisError
from workbench.kernels import qsa
from workbench.kernels.registry import placed, resolve_device
from workbench.numerics.policy import resolve_policy

__all__ = ["relocation_invariance", "relocation_invariance_captures", "find_attention_inputs", "captured_decode_inputs",
           "relocation_model", "describe_relocation_model"]


def _diff(a: torch.Tensor, b: torch.Tensor) -> tuple[bool, float, int]:
    a64, b64 = a.double(), b.double()
    neq = ~((a == b) | (torch.isnan(a) & torch.isnan(b)))
    return bool(not neq.any()), float((a64 - b64).abs().nan_to_num(0.0).max()) if a.numel() else 0.0, int(neq.sum())


def relocation_invariance(layers: Mapping[int, tuple] | tuple, *, seeds: Sequence[int] = (1, 2, 3),
                          page_orders: Sequence[str] = ("logical", "physical"), num_splits: int = 2,
                          page_size: int = 4, spare_pages: int = 0, backend: str = "torch",
                          policy=None, device=None) -> xr.Dataset:
    """Run QSA decode before and after relocating the KV pages; check the outputs bit for bit.

    Parameters
    ----------
    layers: ``{layer: (q, k, v, indices)}`` or one such tuple (layer 0): ``q`` ``[B, HQ, D]``,
        dense ``k``/``v`` ``[B, T, HKV, D]``, ``indices`` ``[B, L]`` int32 logical positions (-1
        padded, e.g. from :func:`workbench.kernels.qsa.select`)
    seeds: one relocation (a random page permutation) per seed
    page_orders: the kernel variants (``Policy.page_order``) to check
    num_splits: KV splits of the decode (relocation moves the split boundaries of a
        physical-order kernel)
    page_size: tokens per page; spare_pages: free pages in the pool (more places to move to)
    backend, policy: the QSA backend and base policy (``page_order`` is set per variant)
    device: where the backend runs (None: q's device; "auto": the GPU when there is one; "cpu",
        "cuda"): the inputs and the paged cache are placed there

    Returns
    -------
    xarray.Dataset with dims ``layer``, ``page_order``, ``seed``: ``bitwise`` (identical output
    and LSE), ``max_abs`` and ``n_diff`` (differing output elements); ``invariant[layer,
    page_order]`` (bitwise for every seed), ``worst_max_abs[layer, page_order]`` (the largest
    difference over the seeds); attrs say which variants are invariant.

    Example
    -------
    >>> B, T, D = 1, 64, 16
    >>> k, v = torch.randn(B, T, 1, D), torch.randn(B, T, 1, D)
    >>> idx = torch.arange(T, dtype=torch.int32)[None]
    >>> ds = relocation_invariance((torch.randn(B, 4, D), k, v, idx), num_splits=4)
    >>> bool(ds.invariant.sel(page_order="logical").all()), bool(ds.invariant.sel(page_order="physical").all())
    (True, False)
    """
    if isinstance(layers, tuple):
        layers = {0: layers}
    if not isinstance(layers, Mapping) or not layers:
        raise AnalysisError(f"layers must be {{layer: (q, k, v, indices)}} or one tuple, got {type(layers).__name__}",
                            key="layers", fix="pass relocation_invariance({3: (q, k, v, idx)})")
    base = resolve_policy(policy)
    L, P, S = sorted(layers), list(page_orders), list(seeds)
    bit = np.zeros((len(L), len(P), len(S)), dtype=bool)
    mx = np.zeros(bit.shape)
    nd = np.zeros(bit.shape, dtype=np.int64)
    dev = resolve_device(device) if device is not None else None
    for i, layer in enumerate(L):
        try:
            q, k, v, idx = layers[layer]
        except (TypeError, ValueError):
            raise AnalysisError(f"layers[{layer}] must be (q, k, v, indices)", key="layers",
                                fix="pass q [B, HQ, D], k/v [B, T, HKV, D], indices [B, L]") from None
        _, (q, k, v, idx) = placed(dev, q, k, v, idx)  # dev None: where q is
        T = k.shape[1]
        need = k.shape[0] * -(-T // page_size)
        cache = qsa.PagedKVCache.from_dense(k, v, page_size=page_size, num_pages=need + spare_pages)
        for j, order in enumerate(P):
            pol = base.replace(page_order=order)
            o0, l0 = qsa.sparse_decode(q, cache, cache.block_table, idx, num_splits=num_splits, policy=pol,
                                       backend=backend)
            for s, seed in enumerate(S):
                moved = cache.relocate(seed=seed)
                o1, l1 = qsa.sparse_decode(q, moved, moved.block_table, idx, num_splits=num_splits, policy=pol,
                                           backend=backend)
                same_o, mx[i, j, s], nd[i, j, s] = _diff(o1, o0)
                bit[i, j, s] = same_o and _diff(l1, l0)[0]
    dims = ("layer", "page_order", "seed")
    ds = xr.Dataset({"bitwise": (dims, bit), "max_abs": (dims, mx), "n_diff": (dims, nd)},
                    coords={"layer": L, "page_order": P, "seed": S})
    ds["invariant"] = ds.bitwise.all("seed")
    ds["worst_max_abs"] = ds.max_abs.max("seed")  # the largest difference over the relocations
    inv = {o: bool(ds.invariant.sel(page_order=o).all()) for o in P}
    ds.attrs.update(analysis="relocation_invariance", backend=backend, device=str(q.device), num_splits=num_splits, page_size=page_size,
                    policy=base.label(), check="bitwise equality of output and LSE after relocating every page",
                    invariant_orders=",".join(o for o in P if inv[o]) or "none",
                    failing_orders=",".join(o for o in P if not inv[o]) or "none")
    return ds


def relocation_invariance_captures(reference, relocated: Mapping[str, object] | Sequence, *, op: str = "qsa",
                                   names: Sequence[str] = ("o", "gated", "output")) -> xr.Dataset:
    """Bitwise comparison of QSA tensors per layer between a run and re-runs whose KV pages sit
    elsewhere (any engine: only the captures are read).

    Parameters
    ----------
    reference: the capture (or path) of the run with the original page placement
    relocated: ``{label: capture}`` (or a list; labels are the arms) of runs with pages moved
    op, names: the op and the tensor names to check (names missing from a capture are skipped)

    Returns
    -------
    xarray.Dataset with dims ``run``, ``layer``, ``name``: ``bitwise`` (every step and rank
    identical; False where a key is missing), ``n_keys`` and ``n_diff_keys``; ``invariant[run]``.

    Example
    -------
    >>> ds = relocation_invariance_captures("runs/logical", {"moved": "runs/logical-moved"})   # doctest: +SKIP
    >>> bool(ds.invariant.sel(run="moved"))                                                    # doctest: +SKIP
    True
    """
    ref = reference if isinstance(reference, Capture) else open_capture(reference)
    if not isinstance(relocated, Mapping):
        caps = [c if isinstance(c, Capture) else open_capture(c) for c in relocated]
        relocated = {c.arm: c for c in caps}
    runs = {k: (c if isinstance(c, Capture) else open_capture(c)) for k, c in relocated.items()}
    ri = ref.select(op=op).index
    names = [n for n in names if (ri["name"] == n).any()]
    if not names:
        raise AnalysisError(f"the reference has none of the tensors {op}/{list(names)}", key="names",
                            file=ref.path, fix=f"use names among {sorted(ri['name'].unique())}")
    layers = sorted(ri["layer"].unique().tolist())
    R = list(runs)
    bit = np.zeros((len(R), len(layers), len(names)), dtype=bool)
    nk = np.zeros(bit.shape, dtype=np.int64)
    ndk = np.zeros(bit.shape, dtype=np.int64)
    for a, label in enumerate(R):
        cap = runs[label]
        for b, layer in enumerate(layers):
            for c, n in enumerate(names):
                rows = ri[(ri["layer"] == layer) & (ri["name"] == n)]
                diff = 0
                for _, row in rows.iterrows():
                    key = dict(rank=int(row["rank"]), step=int(row["step"]), layer=layer, op=op, name=n)
                    try:
                        other = cap.get(**key)
                    except KeyError:
                        diff += 1
                        continue
                    mine = ref.get(**key)
                    if mine.shape != other.shape or not _diff(mine, other)[0]:
                        diff += 1
                nk[a, b, c], ndk[a, b, c] = len(rows), diff
                bit[a, b, c] = diff == 0 and len(rows) > 0
    dims = ("run", "layer", "name")
    ds = xr.Dataset({"bitwise": (dims, bit), "n_keys": (dims, nk), "n_diff_keys": (dims, ndk)},
                    coords={"run": R, "layer": layers, "name": names})
    ds["invariant"] = ds.bitwise.all(("layer", "name"))
    ds.attrs.update(analysis="relocation_invariance_captures", reference=str(ref.path), op=op,
                    check="bitwise equality of every step and rank")
    return ds


def find_attention_inputs(cap, op: str | None = None) -> str | None:
    """The op whose ``q``, ``k``, ``v`` and ``indices`` (the sparse attention's selected positions)
    are recorded: ``op`` when given (checked), else the one op that has all four (None: none has
    them; AnalysisError: several do)."""
    cap = cap if isinstance(cap, Capture) else open_capture(cap)
    need = {"q", "k", "v", "indices"}
    have = cap.index[cap.index["layer"] >= 0].groupby("op")["name"].agg(set)
    ops = sorted(o for o, names in have.items() if need <= names)
    if op:
        if op not in ops:
            raise AnalysisError(f"op {op!r} of {cap.path} does not hold all of {sorted(need)}", key="qsa", file=cap.path,
                                fix=f"use one of {ops}" if ops else "record q, k, v and indices of the sparse attention")
        return op
    if len(ops) > 1:
        raise AnalysisError(f"several ops hold q, k, v, indices in {cap.path}: {ops}", key="qsa", file=cap.path,
                            fix="name one with qsa='op'")
    return ops[0] if ops else None


def captured_decode_inputs(cap, *, op: str, rank: int = 0) -> dict[int, tuple]:
    """``{layer: (q, k, v, indices)}`` for :func:`relocation_invariance` from a capture: the query
    and indices of the last recorded position of each layer's last step, and the KV of every
    position before it (k/v of each step concatenated in step order: a prefill recorded whole,
    then one row per decode step). Layers whose recorded KV does not cover every selected
    position are left out; AnalysisError when none is covered."""
    cap = cap if isinstance(cap, Capture) else open_capture(cap)
    sel = cap.select(op=op, rank=rank)
    out, short = {}, []
    for layer in sorted(int(x) for x in sel.index["layer"].unique()):
        lay = sel.select(layer=layer)
        steps = sorted(int(s) for s in lay.index["step"].unique())
        rows = lay.index
        if any("positions" in (t or {}) for t in rows[rows["name"].isin(["k", "v"])]["tags"]):
            short.append(f"layer {layer}: k/v recorded for some positions only")
            continue
        try:
            k = torch.cat([lay.get(step=s, name="k").reshape(-1, *lay.get(step=s, name="k").shape[-2:]) for s in steps])
            v = torch.cat([lay.get(step=s, name="v").reshape(-1, *lay.get(step=s, name="v").shape[-2:]) for s in steps])
            q = lay.get(step=steps[-1], name="q")
            idx = lay.get(step=steps[-1], name="indices")
        except KeyError as e:
            short.append(f"layer {layer}: {e}")
            continue
        q = q.reshape(-1, *q.shape[-2:])[-1:].float()
        idx = idx.reshape(-1, idx.shape[-1])[-1:].int()
        need = int(idx.max()) + 1 if idx.numel() else 0
        if need > k.shape[0]:
            short.append(f"layer {layer}: indices reach position {need - 1}, k/v hold {k.shape[0]}")
            continue
        out[layer] = (q, k[None].float(), v[None].float(), idx)
    if not out:
        raise AnalysisError(f"no layer of {op} in {cap.path} holds the KV of every selected position ({'; '.join(short)})",
                            key="qsa", file=cap.path,
                            fix="record q, k, v, indices of every position (a whole prefill and every decode step)")
    return out


class _Memory:
    """A writer for :meth:`HybridDecoder.generate` that keeps every tensor in memory, in the order
    the model produced them (the causal order)."""

    def __init__(self) -> None:
        self.tensors: dict[tuple, torch.Tensor] = {}

    def add(self, t, *, rank, step, layer, op, name, **_tags):
        self.tensors[(int(rank), int(step), int(layer), str(op), str(name))] = t.detach().clone()


def _rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.double(), b.double()
    n = float(a64.norm())
    return float((a64 - b64).norm()) / n if n > 0 else float((a64 - b64).norm())


def relocation_model(model, prompt: torch.Tensor, *, arm=None, steps: int = 1, n_relocations: int = 12,
                     orders: Sequence[str] = ("physical", "logical")) -> xr.Dataset:
    """The model-level story of relocation: run the whole model with its KV pages in allocation
    order and after ``n_relocations`` physical relocations (``ArmConfig.page_seed`` 1..n), for each
    QSA page order; compare every recorded tensor of each relocated run with the unrelocated one.

    For a page-order-dependent kernel the first differing tensor is a QSA output while that layer's
    inputs (q, k, v, gate, index scores, indices) are bitwise equal, and the difference grows
    layer by layer to the final hidden state and the log-probabilities; in canonical (logical)
    order every relocation is bitwise identical.

    Parameters
    ----------
    model: a :class:`workbench.models.hybrid.HybridDecoder`
    prompt: ``[T]`` prompt ids; ``steps``: decode steps after the prefill
    arm: the base :class:`~workbench.models.hybrid.ArmConfig` (its ``qsa.page_order`` is set per order)

    Returns
    -------
    xarray.Dataset over (``order``, ``relocation``): ``first_key`` (the first differing tensor in
    causal order, "" when none), ``qsa_inputs_equal`` (1 when the inputs of that QSA layer are bitwise equal, 0 when not, NaN
    when the first difference is not in a QSA layer or there is none),
    ``hidden_bitwise`` (the final hidden state, every step), ``hidden_rel_l2`` (at the last step),
    ``logprob_bitwise`` (the first decoded token's log-probability under each rank's view: the
    logits are computed after the all-reduce, so one per relocation), ``ranks_bitwise`` (number of
    ranks whose QSA outputs are bitwise equal at every layer and step); ``growth[order, relocation,
    layer]`` (relative L2 of each layer's output at the last step); attrs ``tp``, ``n_relocations``.
    """
    from workbench.models.hybrid import ArmConfig, RecordSpec

    arm = arm or ArmConfig(name="relocation")
    spec = RecordSpec(detail_steps=None, prefill_positions=1)
    n_layers = model.config.n_layers
    out = {k: np.zeros((len(orders), n_relocations), dtype=object if k == "first_key" else float)
           for k in ("first_key", "qsa_inputs_equal", "hidden_bitwise", "hidden_rel_l2", "logprob_bitwise", "ranks_bitwise")}
    growth = np.full((len(orders), n_relocations, n_layers), np.nan)
    qsa_inputs = ("input", "q", "k", "v", "gate", "index_scores", "indices")
    for oi, order in enumerate(orders):
        base_arm = arm.replace(qsa=arm.qsa.replace(page_order=order), page_seed=None)

        def run(seed):
            mem = _Memory()
            model.generate(prompt, steps=steps, arm=base_arm.replace(page_seed=seed), writer=mem, spec=spec)
            return mem.tensors

        base = run(None)
        last = max(k[1] for k in base)
        # what every relocation is compared on, from the unrelocated run once
        hidden_keys = [k for k in base if k[3] == "lm_head" and k[4] == "input"]
        first_dec = min(k[1] for k in base if k[3] == "sampler")
        lk = (0, first_dec, -1, "lm_head", "logits")
        tok = int(base[(0, first_dec, -1, "sampler", "token")].reshape(-1)[0])
        base_lp = torch.log_softmax(base[lk].double().reshape(-1), -1)[tok]
        rank_keys = {r: [k for k in base if k[3] == "qsa" and k[0] == r and k[4] in ("o", "gated", "output")]
                     for r in sorted({k[0] for k in base if k[3] == "qsa"})}
        for ri in range(n_relocations):
            rel = run(ri + 1)
            first = next((k for k in base if not torch.equal(base[k], rel[k])), None)
            out["first_key"][oi, ri] = "" if first is None else " ".join(f"{f}={v}" for f, v in zip(
                ("rank", "step", "layer", "op", "name"), first))
            if first is not None and first[3] == "qsa":
                r_, s_, l_ = first[:3]
                out["qsa_inputs_equal"][oi, ri] = all(torch.equal(base[(r_, s_, l_, "qsa", n)], rel[(r_, s_, l_, "qsa", n)])
                                                      for n in qsa_inputs if (r_, s_, l_, "qsa", n) in base)
            else:  # no QSA layer first (or nothing differs): the question does not arise
                out["qsa_inputs_equal"][oi, ri] = float("nan")
            out["hidden_bitwise"][oi, ri] = all(torch.equal(base[k], rel[k]) for k in hidden_keys)
            out["hidden_rel_l2"][oi, ri] = _rel_l2(base[(0, last, -1, "lm_head", "input")],
                                                   rel[(0, last, -1, "lm_head", "input")])
            out["logprob_bitwise"][oi, ri] = bool(base_lp == torch.log_softmax(rel[lk].double().reshape(-1), -1)[tok])
            out["ranks_bitwise"][oi, ri] = sum(all(torch.equal(base[k], rel[k]) for k in keys)
                                               for keys in rank_keys.values())
            for layer in range(n_layers):
                k = (0, last, layer, "layer", "output")
                growth[oi, ri, layer] = _rel_l2(base[k], rel[k])
    ds = xr.Dataset(
        {"first_key": (("order", "relocation"), out["first_key"].astype(str)),
         "qsa_inputs_equal": (("order", "relocation"), out["qsa_inputs_equal"].astype(float)),
         "hidden_bitwise": (("order", "relocation"), out["hidden_bitwise"].astype(bool)),
         "hidden_rel_l2": (("order", "relocation"), out["hidden_rel_l2"].astype(float)),
         "logprob_bitwise": (("order", "relocation"), out["logprob_bitwise"].astype(bool)),
         "ranks_bitwise": (("order", "relocation"), out["ranks_bitwise"].astype(np.int64)),
         "growth": (("order", "relocation", "layer"), growth)},
        coords={"order": list(orders), "relocation": np.arange(1, n_relocations + 1), "layer": np.arange(n_layers)},
    )
    ds.attrs.update(analysis="relocation_model", tp=int(arm.tp), n_relocations=int(n_relocations), steps=int(steps),
                    prompt_len=int(prompt.shape[0]))
    return ds


def describe_relocation_model(ds: xr.Dataset) -> list[str]:
    """One sentence per page order: where the relocated runs first part, with what inputs, how far
    the difference grows, and how many relocations leave everything bitwise identical."""
    out = []
    n = ds.sizes["relocation"]
    for order in ds.order.values:
        d = ds.sel(order=order)
        same = int((d.first_key.values == "").sum())
        tp = ds.attrs["tp"]
        s = (f"{order} page order: {same} of {n} relocations bitwise identical in every tensor; final hidden state "
             f"bitwise in {int(d.hidden_bitwise.sum())}/{n}, first-token log-prob in {int(d.logprob_bitwise.sum())}/{n}, "
             f"QSA outputs of all {tp} ranks in {int((d.ranks_bitwise.values == tp).sum())}/{n}")
        if same < n:
            firsts = sorted({k for k in d.first_key.values if k})
            inputs = d.qsa_inputs_equal.values[d.first_key.values != ""]
            g = d.growth.values
            worst = int(np.nanargmax(d.hidden_rel_l2.values))
            first_layer = [int(np.argmax(row > 0)) for row in g if (row > 0).any()]
            s += (f"; first difference at {', '.join(firsts[:3])}" + (" ..." if len(firsts) > 3 else "")
                  + (f" with that QSA layer's inputs bitwise equal in {int(np.nansum(inputs))}/{len(inputs)}"
                     if np.isfinite(inputs).any() else "")
                  + f"; it grows from rel. L2 {g[worst, first_layer[0] if first_layer else 0]:.3g} at layer "
                    f"{first_layer[0] if first_layer else 0} to {float(d.hidden_rel_l2.values[worst]):.3g} in the final "
                    f"hidden state (worst relocation {int(d.relocation.values[worst])}; median "
                    f"{float(np.median(d.hidden_rel_l2.values)):.3g})")
        out.append(s)
    return out
