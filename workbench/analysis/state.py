"""GDN recurrent state: drift over decode steps, chunked continuation, prefill-to-decode handoff.

The truth is the FP64 oracle of :mod:`workbench.kernels.gdn` run on the same inputs; errors are
relative L2 per value head (over batch, K and V) unless said otherwise, so a drift that starts in
one head is visible before it spreads.
"""

from __future__ import annotations

import numpy as np
import torch
import xarray as xr

from workbench.capture.reader import Capture, open_capture
from workbench.errors import AnalysisError
from workbench.kernels import gdn
from workbench.kernels.registry import placed
from workbench.numerics.policy import Policy, resolve_policy

__all__ = ["state_drift", "state_evolution", "chunked_continuation", "prefill_decode_handoff", "growth", "trend",
           "find_state", "find_gdn_inputs", "gdn_input_sequence"]


def _rel_per_head(x: torch.Tensor, ref: torch.Tensor, head_dim: int) -> np.ndarray:
    """Relative L2 of x vs ref per index of ``head_dim`` (other dims reduced)."""
    x, ref = x.double(), ref.double()
    dims = [d for d in range(ref.dim()) if d != head_dim % ref.dim()]
    num = (x - ref).pow(2).sum(dims).sqrt()
    den = ref.pow(2).sum(dims).sqrt()
    return (num / torch.where(den > 0, den, torch.ones_like(den))).numpy()


def growth(err: xr.DataArray, dim: str = "step") -> float:
    """Mean of ``err`` over the last quarter of ``dim`` divided by its mean over the first quarter
    (steps with zero error excluded from the first quarter); > 1 means the error grows."""
    e = err.mean([d for d in err.dims if d != dim]).to_numpy()
    n = max(1, len(e) // 4)
    head = e[:n][e[:n] > 0]
    if not len(head):
        head = e[e > 0][:n]
    return float(np.mean(e[-n:]) / np.mean(head)) if len(head) else float("nan")


def trend(err: xr.DataArray, dim: str = "step") -> float:
    """Spearman rank correlation of the mean of ``err`` (other dims) with ``dim``: +1 when the
    error grows at every step."""
    e = err.mean([d for d in err.dims if d != dim]).to_numpy()
    if len(e) < 2:
        return float("nan")
    ra = np.argsort(np.argsort(e)).astype(float)
    rb = np.arange(len(e), dtype=float)
    return float(np.corrcoef(ra, rb)[0, 1])


def _open(c) -> Capture:
    return c if isinstance(c, Capture) else open_capture(c)


def state_drift(candidate, control, *, op: str = "gdn", name: str = "state", rank: int | None = 0,
                layers=None, head_dim: int = -3) -> xr.Dataset:
    """Per-head relative error of the candidate's captured GDN state against the control's, per
    layer and step.

    Parameters
    ----------
    candidate, control: captures (or paths) holding ``op/name`` states ``[HV, K, V]`` or
        ``[B, HV, K, V]`` at the same keys (:func:`find_state` finds ``op/name`` in any capture)
    rank: the rank to read (None: all ranks, heads concatenated in rank order)
    layers: the layers to read (None: every layer that has the state)
    head_dim: the dim of the value head in one stored state (-3: ``[HV, K, V]`` and ``[B, HV, K, V]``)

    Returns
    -------
    xarray.Dataset with dims ``layer``, ``step``, ``head``: ``rel_err`` (vs control), and
    ``rel_err_max`` (max over heads, ``layer`` x ``step``); attrs ``growth`` (last-quarter over
    first-quarter mean error, see :func:`growth`), ``trend`` (Spearman correlation of the error
    with the step, see :func:`trend`) and ``growing`` (growth > 1.5).

    Example
    -------
    >>> ds = state_drift("captures/candidate-bf16-state", "captures/control")   # doctest: +SKIP
    >>> ds.attrs["growing"], ds.attrs["trend"] > 0.5                             # doctest: +SKIP
    (1, True)
    """
    cand, ctl = _open(candidate), _open(control)
    sel = dict(op=op, name=name)
    if rank is not None:
        sel["rank"] = rank
    ci, di = ctl.select(**sel).index, cand.select(**sel).index
    if not len(ci):
        raise AnalysisError(f"the control has no {op}/{name} tensors" + (f" on rank {rank}" if rank is not None else ""),
                            key="name", file=ctl.path, fix="pass op=/name= of the recurrent state (e.g. gdn/state)")
    keys = ci[["rank", "step", "layer"]].merge(di[["rank", "step", "layer"]])
    if layers is not None:
        keys = keys[keys["layer"].isin(list(layers))]
    L = sorted(keys["layer"].unique().tolist())
    S = sorted(keys["step"].unique().tolist())
    R = sorted(keys["rank"].unique().tolist())
    if not L:
        raise AnalysisError("no common state keys between the captures", key="layers",
                            fix="compare captures of the same model and record spec")
    per = None
    out = None
    for li, l in enumerate(L):
        for si, s in enumerate(S):
            parts = []
            for r in R:
                a = cand.get(rank=r, step=s, layer=l, op=op, name=name)
                b = ctl.get(rank=r, step=s, layer=l, op=op, name=name)
                parts.append(_rel_per_head(a, b, head_dim))
            e = np.concatenate(parts)
            if out is None:
                per = len(e)
                out = np.full((len(L), len(S), per), np.nan)
            out[li, si] = e
    ds = xr.Dataset({"rel_err": (("layer", "step", "head"), out)},
                    coords={"layer": L, "step": S, "head": np.arange(per)})
    ds["rel_err_max"] = ds.rel_err.max("head")
    ds["rel_err"].attrs["long_name"] = "relative L2 per head of the candidate's state vs the control's"
    g = growth(ds.rel_err_max)
    ds.attrs.update(analysis="state_drift", candidate=str(cand.path), control=str(ctl.path), op=op, name=name,
                    rank="all" if rank is None else rank, growth=g, trend=trend(ds.rel_err_max), growing=int(g > 1.5),
                    growth_definition="mean rel_err_max over the last quarter of steps / over the first quarter")
    return ds


def state_evolution(q, k, v, g, beta, *, policy=None, control_policy=None, backend: str = "torch",
                    initial_state=None, qk_l2norm: bool = True, scale=None, device=None) -> xr.Dataset:
    """Decode ``T`` steps one token at a time and follow the state against the FP64 oracle.

    Parameters
    ----------
    q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]``; g, beta: ``[B, T, HV]`` (GDN layouts)
    policy: the numerics policy under test (e.g. ``Policy(state_dtype="bf16")``)
    control_policy: a second policy to compare with (default the fp32 ``Policy()``)
    backend: the GDN backend of both policies
    device: where the backend runs (None: the inputs' device; "auto": the GPU when there is one);
        the oracle runs on the inputs as given, the errors are computed on the CPU
    initial_state: ``[B, HV, K, V]`` float32 (None: zeros)

    Returns
    -------
    xarray.Dataset with dims ``step`` (1..T) and ``head`` (value heads): ``err_oracle`` and
    ``err_control`` (relative L2 per head of the state after each step), ``out_err_oracle``
    (of the output), ``control_err_oracle`` (the control policy's state vs the oracle); attrs
    ``growth`` and ``trend`` of ``err_oracle`` (see :func:`growth`, :func:`trend`).

    Example
    -------
    >>> B, T, H, K = 1, 64, 1, 8
    >>> q, k, v = torch.randn(B, T, H, K), torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    >>> g, beta = -0.02 * torch.rand(B, T, H), torch.rand(B, T, H)
    >>> ds = state_evolution(q, k, v, g, beta, policy=Policy(state_dtype="bf16"))
    >>> ds.err_oracle.dims
    ('step', 'head')
    """
    pol = resolve_policy(policy)
    cpol = resolve_policy(control_policy) if control_policy is not None else Policy()
    T = q.shape[1]
    HV = v.shape[2]
    dev, (qd, kd, vd, gd, bd, s_t) = placed(device, q, k, v, g, beta, initial_state)
    s_c = s_t
    s_o = None if initial_state is None else initial_state.double()
    eo, ec, ouo, co = (np.zeros((T, HV)) for _ in range(4))
    for t in range(T):
        args = [x[:, t:t + 1] for x in (q, k, v, g, beta)]
        dargs = [x[:, t:t + 1] for x in (qd, kd, vd, gd, bd)]
        o_t, s_t = gdn.recurrent(*dargs, initial_state=s_t, qk_l2norm=qk_l2norm, scale=scale, backend=backend, policy=pol)
        _, s_c = gdn.recurrent(*dargs, initial_state=s_c, qk_l2norm=qk_l2norm, scale=scale, backend=backend, policy=cpol)
        o_o, s_o = gdn.recurrent(*args, initial_state=s_o, qk_l2norm=qk_l2norm, scale=scale, backend="oracle")
        st, sc = s_t.cpu(), s_c.cpu()
        eo[t] = _rel_per_head(st, s_o, 1)
        ec[t] = _rel_per_head(st, sc, 1)
        co[t] = _rel_per_head(sc, s_o, 1)
        ouo[t] = _rel_per_head(o_t.cpu(), o_o, 2)
    dims = ("step", "head")
    ds = xr.Dataset({"err_oracle": (dims, eo), "err_control": (dims, ec), "out_err_oracle": (dims, ouo),
                     "control_err_oracle": (dims, co)},
                    coords={"step": np.arange(1, T + 1), "head": np.arange(HV)})
    ds.attrs.update(analysis="state_evolution", backend=backend, device=str(dev), policy=pol.label(), control_policy=cpol.label(),
                    metric="relative L2 per value head over batch, K and V", oracle="gdn backend 'oracle' (fp64)",
                    growth=growth(ds.err_oracle), trend=trend(ds.err_oracle))
    return ds


def chunked_continuation(q, k, v, g, beta, *, split: int = 64, chunk_size: int = 64, backend: str = "torch",
                         policy=None, qk_l2norm: bool = True, scale=None, device=None) -> xr.Dataset:
    """Chunked prefill of ``T`` tokens in one call against two calls that hand the state over
    (``split`` then ``T - split``, e.g. 64 + 64 vs 128), each against the FP64 oracle recurrence.
    ``device``: where the backend runs (as in :func:`state_evolution`).

    Returns
    -------
    xarray.Dataset with dims ``variant`` (["one_call", "continued"]) and ``head``:
    ``out_err`` and ``state_err`` (relative L2 vs the oracle), and ``between`` (``head``: the
    relative L2 between the two variants' final states); attrs ``bitwise_equal`` (0/1: the two
    variants give identical outputs and states).

    Example
    -------
    >>> q, k = torch.randn(1, 128, 2, 16), torch.randn(1, 128, 2, 16); v = torch.randn(1, 128, 2, 16)
    >>> g, beta = -0.05 * torch.rand(1, 128, 2), torch.rand(1, 128, 2)
    >>> ds = chunked_continuation(q, k, v, g, beta, split=64)
    >>> float(ds.state_err.max()) < 1e-4
    True
    """
    T = q.shape[1]
    if not 0 < split < T:
        raise AnalysisError(f"split must be in 1..{T - 1} (T={T}), got {split}", key="split",
                            fix="pass split=64 for 64 + 64 of 128 tokens")
    kw = dict(qk_l2norm=qk_l2norm, scale=scale)
    o_ref, s_ref = gdn.recurrent(q, k, v, g, beta, backend="oracle", **kw)
    dev, xd = placed(device, q, k, v, g, beta)
    o1, s1 = gdn.chunked(*xd, chunk_size=chunk_size, backend=backend, policy=policy, **kw)
    a = [x[:, :split] for x in xd]
    b = [x[:, split:] for x in xd]
    oa, sa = gdn.chunked(*a, chunk_size=chunk_size, backend=backend, policy=policy, **kw)
    ob, s2 = gdn.chunked(*b, initial_state=sa, chunk_size=chunk_size, backend=backend, policy=policy, **kw)
    o2 = torch.cat([oa, ob], 1).cpu()
    o1, s1, s2 = o1.cpu(), s1.cpu(), s2.cpu()
    ds = xr.Dataset(
        {"out_err": (("variant", "head"), np.stack([_rel_per_head(o1, o_ref, 2), _rel_per_head(o2, o_ref, 2)])),
         "state_err": (("variant", "head"), np.stack([_rel_per_head(s1, s_ref, 1), _rel_per_head(s2, s_ref, 1)])),
         "between": ("head", _rel_per_head(s2, s1, 1))},
        coords={"variant": ["one_call", "continued"], "head": np.arange(v.shape[2])})
    ds.attrs.update(analysis="chunked_continuation", T=T, split=f"{split}+{T - split}", chunk_size=chunk_size,
                    backend=backend, device=str(dev), policy=resolve_policy(policy).label(),
                    bitwise_equal=int(torch.equal(o1, o2) and torch.equal(s1, s2)),
                    oracle="gdn.recurrent backend 'oracle' (fp64) over all T tokens")
    return ds


def prefill_decode_handoff(q, k, v, g, beta, *, prefill_len: int, backend: str = "torch", policy=None,
                           chunk_size: int | None = None, qk_l2norm: bool = True, scale=None,
                           device=None) -> xr.Dataset:
    """Chunked prefill of the first ``prefill_len`` tokens, then one-token decode steps that
    start from the prefill's final state; every output against the FP64 oracle over all tokens.
    ``device``: where the backend runs (as in :func:`state_evolution`).

    Returns
    -------
    xarray.Dataset with dims ``position`` (0..T-1) and ``head``: ``out_err`` (relative L2 per
    head of each position's output vs the oracle), ``phase`` (position: "prefill"/"decode");
    ``state_err[head]`` of the final state; attrs ``handoff_jump`` (mean decode error of the first
    decode position over the mean error of the last prefill position).

    Example
    -------
    >>> q, k = torch.randn(1, 40, 1, 8), torch.randn(1, 40, 1, 8); v = torch.randn(1, 40, 1, 8)
    >>> g, beta = -0.05 * torch.rand(1, 40, 1), torch.rand(1, 40, 1)
    >>> ds = prefill_decode_handoff(q, k, v, g, beta, prefill_len=32)
    >>> ds.phase.to_numpy()[[31, 32]].tolist()
    ['prefill', 'decode']
    """
    T = q.shape[1]
    if not 0 < prefill_len < T:
        raise AnalysisError(f"prefill_len must be in 1..{T - 1} (T={T}), got {prefill_len}", key="prefill_len",
                            fix="leave at least one token to decode")
    kw = dict(qk_l2norm=qk_l2norm, scale=scale)
    o_ref, s_ref = gdn.recurrent(q, k, v, g, beta, backend="oracle", **kw)
    dev, xd = placed(device, q, k, v, g, beta)
    pre = [x[:, :prefill_len] for x in xd]
    o_p, s = gdn.chunked(*pre, chunk_size=chunk_size, backend=backend, policy=policy, **kw)
    outs = [o_p]
    for t in range(prefill_len, T):
        o_t, s = gdn.recurrent(*[x[:, t:t + 1] for x in xd], initial_state=s, backend=backend,
                               policy=policy, **kw)
        outs.append(o_t)
    o, s = torch.cat(outs, 1).cpu(), s.cpu()
    err = np.stack([_rel_per_head(o[:, t], o_ref[:, t], 1) for t in range(T)])
    ds = xr.Dataset({"out_err": (("position", "head"), err),
                     "phase": ("position", np.where(np.arange(T) < prefill_len, "prefill", "decode")),
                     "state_err": ("head", _rel_per_head(s, s_ref, 1))},
                    coords={"position": np.arange(T), "head": np.arange(v.shape[2])})
    last = float(err[prefill_len - 1].mean())
    ds.attrs.update(analysis="prefill_decode_handoff", prefill_len=prefill_len, T=T, backend=backend, device=str(dev),
                    policy=resolve_policy(policy).label(),
                    handoff_jump=float(err[prefill_len].mean() / last) if last > 0 else float("nan"),
                    oracle="gdn.recurrent backend 'oracle' (fp64) over all T tokens")
    return ds


# -- detection on anyone's captures ------------------------------------------------------------

_FLOATS = ("fp32", "bf16", "fp16", "fp64")
GDN_INPUT_NAMES = ("q", "k", "v", "g", "beta")


def find_state(cap, spec: str | None = None) -> tuple[str, str]:
    """The recurrent-state tensor of a capture: ``spec`` ("op/name") when given, else the float
    tensor of 3 or more dims (``[HV, K, V]`` or ``[B, HV, K, V]``) named like ``state`` (not a
    conv state nor hidden states) at layers >= 0 and at two or more steps. Ambiguous or absent: AnalysisError
    listing the candidates."""
    from workbench.analysis.tokens import parse_tensor

    cap = _open(cap)
    idx = cap.index
    if spec:
        op, name = parse_tensor(spec, "state")
        if not ((idx["op"] == op) & (idx["name"] == name)).any():
            raise AnalysisError(f"{cap.path} holds no {op}/{name} tensor", key="state", file=cap.path,
                                fix="name the recurrent state as op/name from the capture's index (workbench inspect --keys)")
        return op, name
    text = idx["op"] + "/" + idx["name"]
    m = (idx["dtype"].isin(_FLOATS) & (idx["layer"] >= 0) & idx["shape"].map(len).ge(3)
         & text.str.contains("state", case=False) & ~text.str.contains("conv|hidden_state", case=False))
    cands = [(o, n) for (o, n), g in idx[m].groupby(["op", "name"], sort=True) if g["step"].nunique() >= 2]
    if len(cands) == 1:
        return cands[0]
    if cands:
        raise AnalysisError(f"several recurrent-state-like tensors in {cap.path}: {['/'.join(c) for c in cands]}",
                            key="state", file=cap.path, fix="name one with state='op/name'")
    seen = sorted({f"{o}/{n}" for o, n in idx[idx["shape"].map(len).ge(3)][["op", "name"]].itertuples(index=False)})
    raise AnalysisError(f"no recurrent state (a float tensor of >= 3 dims named like 'state', at two or more steps) in "
                        f"{cap.path}; tensors of >= 3 dims: {seen[:12]}", key="state", file=cap.path,
                        fix="record the GDN state at every step, or name it with state='op/name'")


def find_gdn_inputs(cap, op: str | None = None) -> str | None:
    """The op whose tensors ``q, k, v, g, beta`` (flash-linear-attention's names) are recorded:
    ``op`` when given (checked), else the one op that has all five (None when no op has them;
    AnalysisError when several do)."""
    cap = _open(cap)
    idx = cap.index
    have = idx[idx["name"].isin(GDN_INPUT_NAMES) & (idx["layer"] >= 0)].groupby("op")["name"].agg(set)
    ops = sorted(o for o, names in have.items() if set(GDN_INPUT_NAMES) <= names)
    if op:
        if op not in ops:
            raise AnalysisError(f"op {op!r} of {cap.path} does not hold all of {list(GDN_INPUT_NAMES)}", key="inputs",
                                file=cap.path, fix=f"use one of {ops}" if ops else "record q, k, v, g, beta of the GDN op")
        return op
    if len(ops) > 1:
        raise AnalysisError(f"several ops hold GDN inputs {list(GDN_INPUT_NAMES)} in {cap.path}: {ops}", key="inputs",
                            file=cap.path, fix="name one with inputs='op'")
    return ops[0] if ops else None


def _batched(t: torch.Tensor, dims: int) -> torch.Tensor:
    """A captured GDN tensor with its batch dim: q/k/v are [B, T, H, D] (3 dims stored without B),
    g/beta [B, T, H] (2 dims without B), states [B, HV, K, V]."""
    t = t.float()
    return t[None] if t.dim() == dims - 1 else t


def gdn_input_sequence(cap, *, op: str, layer: int, rank: int = 0, state: tuple[str, str] | None = None,
                       tokens: int | None = None) -> tuple[list[torch.Tensor], torch.Tensor | None, str]:
    """GDN inputs of one layer as one token sequence, from what a capture holds.

    In order of preference: the step that holds the most positions in one key (a prefill whose
    inputs were recorded whole, not sliced: tag ``positions`` absent), from a zero state; else the
    decode steps, one token each, concatenated in step order from the state captured at the step
    before the first (``state``: op/name of the recurrent state). At most ``tokens`` positions.

    Returns ``([q, k, v, g, beta], initial_state or None, source in words)``; AnalysisError when
    neither is there.
    """
    cap = _open(cap)
    sel = cap.select(op=op, layer=layer, rank=rank)
    idx = sel.index
    if not len(idx):
        raise AnalysisError(f"no {op} tensors at layer {layer}, rank {rank} in {cap.path}", key="layer",
                            file=cap.path, fix="pick a layer and rank that hold the GDN inputs")
    full = []
    for step, g in idx.groupby("step"):
        rows = g[g["name"].isin(GDN_INPUT_NAMES)]
        if set(rows["name"]) >= set(GDN_INPUT_NAMES) and not any("positions" in (t or {}) for t in rows["tags"]):
            q = _batched(sel.get(step=step, name="q"), 4)
            full.append((q.shape[1], int(step)))
    best = max(full, default=None)
    if best is not None and best[0] >= 16:
        T, step = best
        x = [_batched(sel.get(step=step, name=n), 4 if n in ("q", "k", "v") else 3) for n in GDN_INPUT_NAMES]
        n = min(T, tokens or T)
        return [t[:, :n] for t in x], None, f"{op} inputs of layer {layer} recorded whole at step {step} ({n} positions, zero initial state)"
    decode = sorted(s for T, s in full if T == 1)
    if state is not None and decode:
        sop, sname = state
        st = cap.select(op=sop, name=sname, layer=layer, rank=rank).index
        start = next((s for s in decode if (st["step"] == s - 1).any()), None)
        if start is not None:
            run = [start]
            while run[-1] + 1 in decode:
                run.append(run[-1] + 1)
            run = run[:tokens] if tokens else run
            if len(run) >= 2:
                x = [torch.cat([_batched(sel.get(step=s, name=n), 4 if n in ("q", "k", "v") else 3) for s in run], 1)
                     for n in GDN_INPUT_NAMES]
                s0 = _batched(cap.get(op=sop, name=sname, layer=layer, rank=rank, step=start - 1), 4)
                return x, s0, (f"{op} inputs of layer {layer} at decode steps {run[0]}..{run[-1]} ({len(run)} tokens), "
                               f"from the {sop}/{sname} captured at step {start - 1}")
    raise AnalysisError(f"{cap.path} holds neither a whole recorded sequence of GDN inputs nor consecutive decode "
                        f"steps with the state before them, at layer {layer}, rank {rank}", key="inputs", file=cap.path,
                        fix="record q, k, v, g, beta of every position (or of every decode step with the state)")
