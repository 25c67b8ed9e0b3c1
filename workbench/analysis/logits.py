"""Logit rounding: which tokens tie after the logits are materialized, which one the tie rule
picks, the top-2 margin in ULPs, the regret in nats against golden log-probabilities, and greedy
parity over a decode trajectory.

The FP64 values are the truth when the logits come from hidden states and the lm_head weight
(exact FP64 product) or from a golden model; when only captured logits are given, the FP64 column
is the captured value widened (exact, but no better than the capture). FP32 and BF16 columns are
the FP64 values rounded once, to nearest even (:func:`workbench.numerics.round_to`), which is what
a kernel that accumulates exactly and rounds at the end produces.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
import xarray as xr

from workbench.capture.reader import Capture, open_capture
from workbench.errors import AnalysisError, KernelArgumentError, KeyNotFoundError
from workbench.kernels.sampling import greedy, log_softmax
from workbench.numerics.dtypes import canonical, round_to, torch_dtype, ulp_of

__all__ = ["logit_rounding", "logit_rounding_capture", "logit_ties", "greedy_parity", "captured_logits",
           "ulp_steps", "TIE_RULE"]

TIE_RULE = "first (lowest) token index among the maxima (workbench.kernels.sampling.greedy)"
_INT = {"fp64": torch.int64, "fp32": torch.int32, "bf16": torch.int16, "fp16": torch.int16}


def ulp_steps(a, b, dtype) -> np.ndarray:
    """Number of representable ``dtype`` values between ``a`` and ``b`` (exact, signed b - a).

    ``a`` and ``b`` must already be representable in ``dtype`` (for example outputs of
    :func:`round_to`); +0 and -0 count as one value.

    Example
    -------
    >>> int(ulp_steps(11.125, 11.1875, "bf16"))
    1
    """
    d = canonical(dtype)
    if d not in _INT:
        raise KernelArgumentError(f"dtype must be one of {sorted(_INT)}, got {dtype!r}", key="dtype",
                                  fix="pass dtype='bf16', 'fp16', 'fp32' or 'fp64'")
    bits = torch.finfo(torch_dtype(d)).bits

    def ordered(x):
        t = torch.as_tensor(np.asarray(x, dtype=np.float64)).to(torch_dtype(d)).view(_INT[d]).numpy().astype(np.int64)
        mag = t & ((1 << (bits - 1)) - 1)
        return np.where(t < 0, -mag, mag)

    return ordered(b) - ordered(a)


def _rows(name: str, t) -> torch.Tensor:
    if isinstance(t, np.ndarray):
        t = torch.from_numpy(t)
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() < 1 or t.shape[-1] < 2:
        raise KernelArgumentError(
            f"{name} must be a float tensor [..., V] with V >= 2, got "
            f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}",
            key=name, fix=f"pass {name} as a float tensor whose last dim is the vocabulary")
    return t.reshape(-1, t.shape[-1])


def _fp64_logits(logits, hidden, weight) -> tuple[torch.Tensor, str]:
    if (logits is None) == (hidden is None):
        raise KernelArgumentError(
            "pass either logits= or hidden= with weight=, not both and not neither",
            key="logits", fix="logit_rounding(logits) or logit_rounding(hidden=h, weight=lm_head.weight)")
    if logits is not None:
        t = _rows("logits", logits)
        return t.double(), f"captured {canonical(t.dtype)} logits (FP64 column = captured values widened)"
    if weight is None:
        raise KernelArgumentError("hidden= needs weight= (the lm_head weight [V, D])", key="weight",
                                  fix="pass weight=model.lm_head.weight")
    h = _rows("hidden", hidden)
    w = weight if isinstance(weight, torch.Tensor) else torch.as_tensor(weight)
    if w.dim() != 2 or w.shape[1] != h.shape[1]:
        raise KernelArgumentError(f"weight must be [V, D={h.shape[1]}] (nn.Linear layout), got {tuple(w.shape)}",
                                  key="weight", fix="pass lm_head.weight as stored (not transposed)")
    return h.double() @ w.double().T, (f"FP64 product of {canonical(h.dtype)} hidden states and "
                                        f"{canonical(w.dtype)} lm_head weight")


def logit_rounding(logits=None, *, hidden=None, weight=None, dtype: str = "bf16",
                   dtypes: Sequence[str] = ("fp64", "fp32", "bf16"), golden=None, top: int = 5,
                   regret_limit: float = 0.05, row_coords: dict | None = None) -> xr.Dataset:
    """Values of the leading tokens in several dtypes, ties after rounding, margin and regret.

    Parameters
    ----------
    logits: ``[..., V]`` any float dtype (rows are the leading dims flattened), or None
    hidden: ``[..., D]`` hidden states entering lm_head (with ``weight``), instead of logits
    weight: ``[V, D]`` lm_head weight (``nn.Linear`` layout)
    dtype: the dtype the logits are materialized in before the sampler (the tie analysis)
    dtypes: the dtypes whose values are reported (``dtype`` is added when missing)
    golden: ``[..., V]`` logits of a golden model (FP64 truth) for the regret; default the FP64
        values computed here
    top: the number of leading tokens (by FP64 value) reported; widened to hold every tied token
    regret_limit: a row passes when its regret is at most this many nats
    row_coords: extra coordinates along ``row`` (e.g. ``{"step": [...]}``)

    Returns
    -------
    xarray.Dataset with dims ``row``, ``k`` (rank of the token by FP64 value), ``dtype``:
    ``token[row, k]``, ``value[row, k, dtype]``, ``tied[row, k]`` (equal to the maximum after
    rounding to ``dtype``), ``n_tied[row]``, ``tie[row]``, ``chosen[row]`` (greedy on the
    materialized values: the tie rule picks the lowest index), ``chosen_fp64[row]``,
    ``flipped[row]``, ``margin_ulp[row]`` (representable ``dtype`` values between the top-2
    materialized logits; 0 in a tie), ``margin_fp64[row]`` (FP64 top-1 minus top-2, logit units),
    ``margin_fp64_ulp[row]`` (that margin in ``dtype`` ULPs at the top value: below 1 the
    rounding can tie or flip), ``regret[row]`` (nats: golden log-prob of the golden best token
    minus that of the chosen token), ``regret_pass[row]``.

    Example
    -------
    >>> v = torch.full((1000,), -5.0, dtype=torch.float64)
    >>> v[67], v[692] = 11.11763134, 11.14099662
    >>> ds = logit_rounding(v).isel(row=0)
    >>> int(ds.chosen), int(ds.chosen_fp64), int(ds.n_tied), round(float(ds.regret), 8)
    (67, 692, 2, 0.02336528)
    """
    x64, source = _fp64_logits(logits, hidden, weight)
    d = canonical(dtype)
    names = [canonical(t) for t in dtypes]
    if d not in names:
        names.append(d)
    if not isinstance(top, int) or top < 1:
        raise KernelArgumentError(f"top must be a positive int, got {top!r}", key="top", fix="pass top=5")
    R, V = x64.shape
    mat = torch.from_numpy(round_to(x64, d))
    chosen = greedy(mat)
    chosen64 = greedy(x64)
    vmax = mat.amax(-1, keepdim=True)
    tied_all = mat == vmax
    n_tied = tied_all.sum(-1)
    # top-2 materialized margin: the best value among the tokens other than the chosen one
    others = mat.clone()
    others.scatter_(-1, chosen[:, None], -torch.inf)
    second = others.amax(-1)
    margin_ulp = ulp_steps(second.numpy(), vmax[:, 0].numpy(), d)
    # leading tokens by FP64 value (ties to the lower id); rounding is monotone, so the tokens tied
    # after rounding are the first n_tied of this order and k = max(top, n_tied) holds them all
    k = min(V, max(top, int(n_tied.max())))
    order64 = torch.sort(-x64, dim=-1, stable=True).indices
    tok = order64[:, :k]
    top64 = x64.gather(-1, order64[:, :2])
    margin64 = (top64[:, 0] - top64[:, 1]).numpy()
    sel = x64.gather(-1, tok).numpy()
    values = np.stack([round_to(sel, t) for t in names], axis=-1)
    if golden is None:
        g = x64
        golden_source = "the FP64 logits above"
    else:
        g = _rows("golden", golden).double()
        if g.shape != x64.shape:
            raise KernelArgumentError(f"golden must have the logits' shape {tuple(x64.shape)}, got {tuple(g.shape)}",
                                      key="golden", fix="pass the golden model's logits for the same rows")
        golden_source = "golden logits given by the caller"
    lp = log_softmax(g)
    regret = (lp.amax(-1) - lp.gather(-1, chosen[:, None])[:, 0]).numpy()
    coords: dict[str, Any] = {"row": np.arange(R), "k": np.arange(k), "dtype": names}
    for name, vals in (row_coords or {}).items():
        coords[name] = ("row", np.asarray(vals))
    ds = xr.Dataset(
        {
            "token": (("row", "k"), tok.numpy()),
            "value": (("row", "k", "dtype"), values),
            "tied": (("row", "k"), tied_all.gather(-1, tok).numpy()),
            "logprob_golden": (("row", "k"), lp.gather(-1, tok).numpy()),
            "n_tied": ("row", n_tied.numpy()),
            "tie": ("row", (n_tied > 1).numpy()),
            "chosen": ("row", chosen.numpy()),
            "chosen_fp64": ("row", chosen64.numpy()),
            "flipped": ("row", (chosen != chosen64).numpy()),
            "margin_ulp": ("row", margin_ulp),
            "margin_fp64": ("row", margin64),
            "margin_fp64_ulp": ("row", margin64 / ulp_of(top64[:, 0].numpy(), d)),
            "regret": ("row", regret),
            "regret_pass": ("row", regret <= regret_limit),
        },
        coords=coords,
    )
    ds["value"].attrs["units"] = "logit"
    ds["margin_ulp"].attrs["units"] = f"{d} ULP (representable values)"
    ds["margin_fp64"].attrs["units"] = "logit"
    ds["margin_fp64_ulp"].attrs["units"] = f"{d} ULP at the top value"
    ds["regret"].attrs["units"] = "nats"
    ds.attrs.update(analysis="logit_rounding", materialized_dtype=d, rounding="round to nearest, ties to even, once from FP64",
                    tie_rule=TIE_RULE, source=source, golden=golden_source, regret_limit=float(regret_limit),
                    regret_units="nats", vocab=int(V))
    return ds


def captured_logits(capture, *, op: str = "sampler", name: str = "input", position: int = -1,
                    **filters) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
    """The logits (or hidden states) a capture holds for ``op``/``name``, one row per tensor.

    Each tensor ``[..., T, V]`` contributes the row at ``position`` of its second-to-last dim
    (the last position is the one sampled; prefill captures hold all T positions).

    Returns
    -------
    ``(rows [S, V] tensor in the captured dtype, coords {"step", "rank", "layer"} arrays)``
    """
    cap = _open(capture)
    view = cap.select(op=op, name=name, **filters)
    if len(view) == 0:
        raise KeyNotFoundError(f"no tensor with op={op!r} name={name!r} matches", file=cap.path,
                               key=dict(op=op, name=name, **filters),
                               fix="list the keys with cap.summary(); pass op=/name= of the logits or lm_head input")
    rows, coords = [], {"step": [], "rank": [], "layer": []}
    for _, r in view.index.iterrows():
        t = view._tensor(r)
        rows.append(t.reshape(-1, t.shape[-2], t.shape[-1])[-1, position] if t.dim() >= 2 else t)
        for c in coords:
            coords[c].append(int(r[c]))
    return torch.stack(rows), {c: np.asarray(v) for c, v in coords.items()}


def _open(capture) -> Capture:
    return capture if isinstance(capture, Capture) else open_capture(capture)


def logit_rounding_capture(capture, *, weight=None, op: str = "lm_head", name: str | None = None,
                           weight_name: str = "weight", position: int = -1, **kwargs) -> xr.Dataset:
    """:func:`logit_rounding` over a capture's steps.

    With ``op="lm_head"`` (the default) the hidden states (``name="input"``) are multiplied by the
    lm_head weight in FP64; the weight comes from ``weight=`` or from the capture's
    ``op/weight_name`` tensor. With any other op (e.g. ``"sampler"``) the tensors named ``name``
    (default ``"input"``) are taken as logits. Filters (step=, rank=, ...) go to
    :meth:`Capture.select`; other keyword arguments to :func:`logit_rounding`.

    Example
    -------
    >>> ds = logit_rounding_capture("captures/control", op="sampler")     # doctest: +SKIP
    >>> ds.chosen.values, ds.tie.values                                  # doctest: +SKIP
    """
    cap = _open(capture)
    filters = {k: kwargs.pop(k) for k in list(kwargs) if k in ("step", "rank", "layer", "seq") or k.startswith("tag_")}
    name = name or "input"
    rows, coords = captured_logits(cap, op=op, name=name, position=position, **filters)
    if op == "lm_head" and name == "input":
        if weight is None:
            wv = cap.select(op=op, name=weight_name)
            if len(wv) == 0:
                raise KernelArgumentError(
                    f"the capture has no {op}/{weight_name} tensor and no weight= was given", key="weight",
                    fix="pass weight=model.lm_head.weight, or op='sampler' to analyse the captured logits")
            weight = wv._tensor(wv.index.iloc[0])
        ds = logit_rounding(hidden=rows, weight=weight, row_coords=coords, **kwargs)
    else:
        ds = logit_rounding(rows, row_coords=coords, **kwargs)
    ds.attrs.update(capture=str(cap.path), arm=cap.arm, op=op, name=name, position=int(position))
    return ds


def _trajectory(arm, label: str, op: str, name: str, position: int) -> tuple[torch.Tensor, np.ndarray | None]:
    if isinstance(arm, (Capture, str)) or hasattr(arm, "__fspath__"):
        rows, coords = captured_logits(arm, op=op, name=name, position=position)
        return rows, coords["step"]
    if isinstance(arm, (list, tuple)):
        arm = torch.stack([torch.as_tensor(a).reshape(-1) for a in arm])
    return _rows(label, arm), None


def _describe(arm) -> str:
    if isinstance(arm, Capture):
        return str(arm.path)
    if isinstance(arm, str) or hasattr(arm, "__fspath__"):
        return str(arm)
    return "logits given as tensors"


def greedy_parity(control, candidate, *, dtype: str = "bf16", op: str = "sampler", name: str = "input",
                  position: int = -1) -> xr.Dataset:
    """Per decode step: does greedy pick the same token in both arms, with what margin, on a tie?

    Parameters
    ----------
    control, candidate: a Capture / capture path (its ``op``/``name`` logits per step), or a
        tensor ``[steps, V]`` (or list of ``[V]``) of logits
    dtype: the dtype logits are materialized in before greedy (rounded once, RNE, from the values)

    Returns
    -------
    xarray.Dataset along ``step`` with dim ``arm`` (control, candidate): ``token[step, arm]``,
    ``token_fp64[step, arm]``, ``tie[step, arm]``, ``n_tied``, ``margin_ulp[step, arm]``,
    ``margin_fp64[step, arm]``; and ``same[step]`` (same materialized token), ``first_mismatch``
    (attr: the first step whose tokens differ, -1 if none).

    Example
    -------
    >>> a = torch.tensor([[1.0, 2.0, 0.0], [3.0, 1.0, 0.5]])
    >>> b = torch.tensor([[1.0, 2.0, 0.0], [1.0, 3.0, 0.5]])
    >>> greedy_parity(a, b).same.values.tolist()
    [True, False]
    """
    ra, sa = _trajectory(control, "control", op, name, position)
    rb, sb = _trajectory(candidate, "candidate", op, name, position)
    if ra.shape != rb.shape:
        raise KernelArgumentError(f"the arms' logits differ in shape: control {tuple(ra.shape)}, candidate "
                                  f"{tuple(rb.shape)}", key="candidate",
                                  fix="compare trajectories of the same length and vocabulary (select the same steps)")
    per = [logit_rounding(r, dtype=dtype, top=2) for r in (ra, rb)]
    steps = sa if sa is not None else (sb if sb is not None else np.arange(ra.shape[0]))

    def both(var):
        return (("step", "arm"), np.stack([p[var].values for p in per], axis=-1))

    ds = xr.Dataset(
        {v_out: both(v) for v_out, v in (("token", "chosen"), ("token_fp64", "chosen_fp64"), ("tie", "tie"),
                                         ("n_tied", "n_tied"), ("margin_ulp", "margin_ulp"),
                                         ("margin_fp64", "margin_fp64"))},
        coords={"step": np.asarray(steps), "arm": ["control", "candidate"]},
    )
    ds["same"] = ("step", ds.token.sel(arm="control").values == ds.token.sel(arm="candidate").values)
    bad = np.flatnonzero(~ds.same.values)
    ds["margin_ulp"].attrs["units"] = f"{canonical(dtype)} ULP"
    ds.attrs.update(analysis="greedy_parity", materialized_dtype=canonical(dtype), tie_rule=TIE_RULE,
                    n_steps=int(ra.shape[0]), n_same=int(ds.same.sum()),
                    first_mismatch=int(steps[bad[0]]) if len(bad) else -1,
                    control=_describe(control), candidate=_describe(candidate))
    return ds


def _arm_logits(cap: Capture, spec: str | None) -> tuple[tuple[str, str], torch.Tensor, np.ndarray]:
    from workbench.analysis.tokens import find_logits, first_rank, parse_tensor

    op, name = parse_tensor(spec, "logits") if spec else find_logits(cap)
    rows, coords = captured_logits(cap, op=op, name=name, rank=first_rank(cap, op, name))
    return (op, name), rows, coords["step"]


def _arm_truth(cap: Capture, logit_spec, hidden: str | None, weight, vocab: int):
    """FP64 logits per step from the arm's own hidden states and the lm_head weight, or None."""
    from workbench.analysis.tokens import find_hidden, first_rank, load_weight, parse_tensor

    h_spec = parse_tensor(hidden, "hidden") if hidden else find_hidden(cap, logit_spec)
    if h_spec is None:
        return None, f"{cap.arm}: no lm_head input recorded next to {'/'.join(logit_spec)}"
    h, coords = captured_logits(cap, op=h_spec[0], name=h_spec[1], rank=first_rank(cap, *h_spec))
    w, where = load_weight(cap, weight, vocab=vocab, hidden=int(h.shape[-1]))
    if w is None:
        return None, where
    truth = h.double() @ w.double().T
    return (truth, coords["step"]), (f"FP64 product of {'/'.join(h_spec)} ({canonical(h.dtype)}) and the lm_head "
                                     f"weight {where} ({canonical(w.dtype)})")


def _fmt_tokens(toks) -> str:
    return ", ".join(str(int(t)) for t in toks)


def logit_ties(control, candidate, *, logits: str | None = None, tokens: str | None = None,
               hidden: str | None = None, weight=None, dtype: str | None = None, step: int | None = None,
               regret_limit: float = 0.05) -> xr.Dataset:
    """Which tokens tie in each arm's materialized logits, what the tie rule and the FP64 truth
    pick, and at which step that decides the arms' tokens; found from the tensors alone.

    Parameters
    ----------
    control, candidate: captures (or paths) holding logits at layer -1 every step
    logits: ``"op/name"`` of the logits in both arms (default: detected per arm,
        :func:`workbench.analysis.tokens.find_logits`)
    tokens: ``"op/name"`` of the sampled tokens (default: detected; else the argmax of the logits)
    hidden: ``"op/name"`` of the lm_head input (default: the ``input`` of the logits' op when recorded)
    weight: the lm_head weight ``[V, D]``: a tensor, ``"op/name"`` in the capture, or
        ``"file.safetensors:tensor"`` (default: detected in the capture). With hidden states and a
        weight the truth is their FP64 product per arm and step; without, it is the arm with the
        more precise logits (widened), and only at steps whose prefixes agree
    dtype: the dtype the sampler sees (default: each arm's captured logits dtype)
    step: the step to explain (default: the first step whose tokens differ; else the first tie the
        tie rule decides against the truth; else the narrowest FP64 margin)

    Returns
    -------
    xarray.Dataset along ``step`` and ``arm`` (control, candidate): ``n_tied`` (tokens equal to
    the materialized maximum), ``chosen`` (the tie rule's pick, lowest index), ``truth_token``,
    ``regret`` (nats, golden = the truth's log-softmax), ``tie_by_index`` (a tie whose pick is not
    the truth's), ``margin_truth_ulp`` (FP64 top-2 gap in ULPs of the materialized dtype); at the
    focus step ``truth_focus[arm, vocab]`` and ``materialized_focus[arm, vocab]``; attrs
    ``focus_step``, ``focus_reason``, ``truth_source``, ``first_differing_step``, ``tied_tokens``,
    ``sentence``.

    Example
    -------
    >>> ds = logit_ties("captures/tie-control", "captures/tie-candidate")   # doctest: +SKIP
    >>> ds.attrs["focus_step"], ds.attrs["tied_tokens"]                      # doctest: +SKIP
    (0, [67, 692])
    """
    from workbench.analysis.tokens import token_agreement

    arms = {"control": _open(control), "candidate": _open(candidate)}
    got = {a: _arm_logits(c, logits) for a, c in arms.items()}
    V = {int(r.shape[-1]) for _, r, _ in got.values()}
    if len(V) != 1:
        raise KernelArgumentError(f"the arms' vocabularies differ: {sorted(V)}", key="logits",
                                  fix="compare runs of the same model (or name the logits with logits='op/name')")
    V = V.pop()
    steps = sorted(set(got["control"][2].tolist()) & set(got["candidate"][2].tolist()))
    if not steps:
        raise KernelArgumentError("the arms hold logits at no common step", key="logits",
                                  fix="record the same decode steps in both arms")
    rows = {a: r[[list(s).index(t) for t in steps]] for a, (_, r, s) in got.items()}
    mdt = {a: canonical(dtype) if dtype else canonical(rows[a].dtype) for a in arms}
    try:
        agree = token_agreement(arms["control"], arms["candidate"], tokens=tokens, logits=logits)
        first = int(agree.attrs["first_differing_step"])
        token_source = agree.attrs["source"]
    except (AnalysisError, KeyNotFoundError):  # no token tensor both arms share: greedy of the logits below
        agree, first, token_source = None, None, None

    truth, why = {}, []
    for a, c in arms.items():
        t, src = _arm_truth(c, got[a][0], hidden, weight, V)
        if t is None:
            why.append(src)
            truth = None
            break
        vals, tsteps = t
        truth[a] = vals[[list(tsteps).index(s) for s in steps]]
        why.append(src)
    mat = {a: torch.from_numpy(round_to(rows[a].double(), mdt[a])) for a in arms}
    chosen = {a: greedy(mat[a]) for a in arms}
    if first is None:
        diff = [s for i, s in enumerate(steps) if int(chosen["control"][i]) != int(chosen["candidate"][i])]
        first = diff[0] if diff else -1
        token_source = "greedy of the materialized logits"
    if truth is not None:
        truth_source = "; ".join(dict.fromkeys(why))
        valid = np.ones(len(steps), dtype=bool)
    else:
        order = ["fp64", "fp32", "bf16", "fp16"]
        ref = min(arms, key=lambda a: (order.index(canonical(rows[a].dtype)) if canonical(rows[a].dtype) in order
                                       else 9, a != "candidate"))
        truth = {a: rows[ref].double() for a in arms}
        valid = np.array([first < 0 or s <= first for s in steps])
        truth_source = (f"the {ref}'s {canonical(rows[ref].dtype)} logits widened ({why[0]}; no FP64 truth: pass "
                        f"hidden= and weight=); used only at steps whose prefixes agree (<= {first if first >= 0 else steps[-1]})")
    out = {k: [] for k in ("n_tied", "chosen", "truth_token", "regret", "tie_by_index", "margin_truth_ulp")}
    for a in arms:
        m, ch, tr = mat[a], chosen[a], truth[a]
        vmax = m.amax(-1, keepdim=True)
        n_tied = (m == vmax).sum(-1).numpy()
        t_tok = greedy(tr).numpy()
        lp = log_softmax(tr)
        regret = (lp.amax(-1) - lp.gather(-1, ch[:, None])[:, 0]).numpy()
        top2 = torch.topk(tr, 2, dim=-1).values
        gap_ulp = ((top2[:, 0] - top2[:, 1]) / torch.from_numpy(ulp_of(top2[:, 0].numpy(), mdt[a]))).numpy()
        regret = np.where(valid, regret, np.nan)
        t_tok = np.where(valid, t_tok, -1)
        out["n_tied"].append(n_tied)
        out["chosen"].append(ch.numpy())
        out["truth_token"].append(t_tok)
        out["regret"].append(regret)
        out["tie_by_index"].append((n_tied > 1) & valid & (ch.numpy() != t_tok))
        out["margin_truth_ulp"].append(np.where(valid, gap_ulp, np.nan))
    ds = xr.Dataset({k: (("step", "arm"), np.stack(v, axis=-1)) for k, v in out.items()},
                    coords={"step": steps, "arm": list(arms)})
    if step is not None:
        if step not in steps:
            raise KernelArgumentError(f"step {step} is not held by both arms (steps {steps[0]}..{steps[-1]})",
                                      key="step", fix="pass a step both captures hold, or step=None")
        focus, reason = int(step), "the step asked for"
    elif first >= 0:
        focus, reason = first, "the first step whose tokens differ"
    elif ds.tie_by_index.any():
        focus = int(ds.step.values[ds.tie_by_index.any("arm").values][0])
        reason = "the first tie the tie rule decides against the truth (tokens agree)"
    else:
        m = ds.margin_truth_ulp.min("arm").values
        focus = int(ds.step.values[int(np.nanargmin(m))]) if np.isfinite(m).any() else steps[0]
        reason = "the narrowest FP64 top-2 margin (no tie, tokens agree)"
    i = steps.index(focus)
    ds["truth_focus"] = (("arm", "vocab"), np.stack([truth[a][i].numpy() for a in arms]))
    ds["materialized_focus"] = (("arm", "vocab"), np.stack([mat[a][i].numpy() for a in arms]))
    ds["regret"].attrs["units"] = "nats"
    ds["margin_truth_ulp"].attrs["units"] = "ULP of each arm's materialized dtype"
    tied = {}
    parts = []
    for a in arms:
        m = mat[a][i]
        tk = torch.nonzero(m == m.max()).reshape(-1).tolist()
        tied[a] = tk
        sel = ds.sel(step=focus, arm=a)
        t_tok, regret = int(sel.truth_token), float(sel.regret)
        text = f"{a} ({mdt[a]}) picks {int(sel.chosen)}"
        if len(tk) > 1:
            text += f" from a {len(tk)}-way tie of tokens {_fmt_tokens(tk)} at {float(m.max()):.6g} (tie rule: lowest index)"
        if t_tok >= 0:
            tr = truth[a][i]
            gap = float(tr[t_tok] - tr[int(sel.chosen)])
            text += (f"; FP64 picks {t_tok} by {gap:.6g} logits = {gap / float(ulp_of(float(tr[t_tok]), mdt[a])):.3g} "
                     f"{mdt[a]} ULP; regret {regret:.6g} nats" if t_tok != int(sel.chosen) else ", as FP64 does")
        parts.append(text)
    head = (f"step {focus}: " + ("the arms pick different tokens; " if int(ds.chosen.sel(step=focus, arm="control"))
                                 != int(ds.chosen.sel(step=focus, arm="candidate")) else "same token in both arms; "))
    n_tie = {a: int(ds.tie_by_index.sel(arm=a).sum()) for a in arms}
    ds.attrs.update(analysis="logit_ties", focus_step=focus, focus_reason=reason, truth_source=truth_source,
                    first_differing_step=int(first), token_source=token_source, vocab=V,
                    materialized={a: mdt[a] for a in arms}, tied_tokens=tied["control"] if len(tied["control"]) > 1
                    else tied["candidate"] if len(tied["candidate"]) > 1 else [], tied_by_arm=tied,
                    logits={a: "/".join(got[a][0]) for a in arms}, regret_limit=float(regret_limit),
                    n_ties_by_index=n_tie, tie_rule=TIE_RULE,
                    sentence=head + "; ".join(parts) + f" ({reason})",
                    summary=(f"ties decided by index against FP64: control {n_tie['control']}, candidate "
                             f"{n_tie['candidate']} of {len(steps)} steps; worst regret control "
                             f"{np.nanmax(ds.regret.sel(arm='control').values) if valid.any() else float('nan'):.3g}, candidate "
                             f"{np.nanmax(ds.regret.sel(arm='candidate').values) if valid.any() else float('nan'):.3g} nats"))
    return ds
