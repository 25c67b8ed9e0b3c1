"""Trajectory noise: does a candidate move the model's likelihood of fixed text more than the
control moves it against itself?

Free-running outputs part ways at the first near-tie and are then incomparable. A fixed trajectory
is comparable: every arm scores the same tokens (teacher-forced on the control's output), so the
per-token negative log-likelihood (NLL) of arm X minus the control's is a paired difference at
every position. The A/A delta (a repeat of the control, run-to-run noise only) is the yardstick:
a candidate whose deltas are no larger than the A/A deltas is within the control's own noise.

- :func:`trajectory_nll`: from per-token NLL arrays ``[trajectory, position]`` of the control, the
  A/A repeat and the candidate (any source: a model run, an engine's logprobs, captures):
  first-token mean |delta|, full-token mean signed delta and mean |delta| of both comparisons, a
  paired sign test over trajectories of |delta_candidate| against |delta_repeat|.
- :func:`output_churn`: how many complete outputs and first tokens change between two free runs
  (a repeat's churn is the control's own instability).
- :func:`trajectory_nll_captures`: the per-token NLL of the control's tokens from each capture's
  logits at every step while the arms' tokens agree (teacher-forced when the arms were fed the
  control's tokens).
- :func:`score_trajectories`: the hybrid decoder or any Hugging Face causal LM as the source:
  the control generates each prompt's trajectory, every arm scores it and generates its own.
"""

from __future__ import annotations

import contextlib
from typing import Mapping, Sequence

import numpy as np
import xarray as xr

from workbench.errors import KernelArgumentError

__all__ = ["trajectory_nll", "output_churn", "trajectory_nll_captures", "score_trajectories", "hf_arm",
           "score_hf", "generate_hf", "describe_trajectory_noise", "trajectory_source"]


def _as_2d(name: str, a) -> np.ndarray:
    if isinstance(a, (list, tuple)) and a and not np.isscalar(a[0]):
        width = max(len(r) for r in a)
        out = np.full((len(a), width), np.nan)
        for i, r in enumerate(a):
            out[i, :len(r)] = np.asarray(r, dtype=np.float64)
        a = out
    arr = np.asarray(a, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None]
    if arr.ndim != 2:
        raise KernelArgumentError(f"{name} must be per-token NLLs [trajectory, position], got shape {arr.shape}",
                                  key=name, fix="pass one row of token NLLs per trajectory (ragged lists are padded)")
    return arr


def trajectory_nll(control, repeat, candidate, *, alpha: float = 0.05) -> xr.Dataset:
    """Per-token NLL deltas of a candidate and of an A/A repeat against the control, on the same
    fixed trajectories.

    Parameters
    ----------
    control, repeat, candidate: ``[trajectory, position]`` NLL (nats) of the same tokens under each
        arm; ragged lists are padded, NaN marks a missing position (it is left out of every mean)
    alpha: level of the sign test

    Returns
    -------
    xarray.Dataset with ``nll[arm, trajectory, position]`` and ``delta[comparison, trajectory,
    position]`` (comparison ``A/A`` = repeat - control, ``A/B`` = candidate - control); along
    ``comparison``: ``first_token_mean_abs`` (mean over trajectories of |delta| at position 0),
    ``mean_delta`` (mean signed delta over every token), ``mean_abs_delta``, ``n_tokens``,
    ``identical_tokens`` (deltas exactly 0); the sign test over trajectories of mean |delta|
    (``candidate_larger``, ``repeat_larger``, ``sign_p``); ``within_noise``: the candidate's first-token
    and full-token mean |delta| are no larger than the A/A's, or the sign test cannot tell them apart.

    Example
    -------
    >>> ds = trajectory_nll([[1.0, 2.0]], [[1.5, 2.0]], [[1.25, 2.5]])
    >>> ds.first_token_mean_abs.values.tolist(), ds.mean_delta.values.tolist()
    ([0.5, 0.25], [0.25, 0.375])
    """
    from workbench.analysis.stats import mcnemar_exact

    a, r, c = _as_2d("control", control), _as_2d("repeat", repeat), _as_2d("candidate", candidate)
    width = max(a.shape[1], r.shape[1], c.shape[1])
    if not (a.shape[0] == r.shape[0] == c.shape[0]):
        raise KernelArgumentError(f"the arms score different numbers of trajectories: control {a.shape[0]}, "
                                  f"repeat {r.shape[0]}, candidate {c.shape[0]}", key="candidate",
                                  fix="score the same trajectories (the control's tokens) under every arm")
    pad = lambda x: np.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=np.nan)  # noqa: E731
    a, r, c = pad(a), pad(r), pad(c)
    d = np.stack([r - a, c - a])  # [comparison, trajectory, position]
    ok = ~np.isnan(d)
    if not ok[:, :, 0].all():
        raise KernelArgumentError("every trajectory needs its first token scored by all three arms", key="control",
                                  fix="drop trajectories without tokens, or score position 0 in every arm")
    first = np.abs(d[:, :, 0]).mean(1)
    mean_delta = np.array([np.nanmean(d[i]) for i in range(2)])
    mean_abs = np.array([np.nanmean(np.abs(d[i])) for i in range(2)])
    per_traj = np.nanmean(np.abs(d), axis=2)  # [comparison, trajectory]
    cand_larger = int((per_traj[1] > per_traj[0]).sum())
    rep_larger = int((per_traj[0] > per_traj[1]).sum())
    p = mcnemar_exact(cand_larger, rep_larger)
    both = ok[0] & ok[1]
    tok_c = int((np.abs(d[1]) > np.abs(d[0]))[both].sum())
    tok_r = int((np.abs(d[0]) > np.abs(d[1]))[both].sum())
    p_tok = mcnemar_exact(tok_c, tok_r)
    within = not (mean_abs[1] > mean_abs[0] and p_tok < alpha)
    n_traj = a.shape[0]
    ds = xr.Dataset(
        {"nll": (("arm", "trajectory", "position"), np.stack([a, r, c])),
         "delta": (("comparison", "trajectory", "position"), d),
         "first_token_mean_abs": ("comparison", first), "mean_delta": ("comparison", mean_delta),
         "mean_abs_delta": ("comparison", mean_abs), "n_tokens": ("comparison", ok.sum((1, 2))),
         "identical_tokens": ("comparison", (d == 0).sum((1, 2))),
         "candidate_larger": cand_larger, "repeat_larger": rep_larger, "sign_p": p,
         "tokens_candidate_larger": tok_c, "tokens_repeat_larger": tok_r, "sign_p_tokens": p_tok,
         "within_noise": within},
        coords={"arm": ["control", "repeat", "candidate"], "comparison": ["A/A", "A/B"],
                "trajectory": np.arange(n_traj), "position": np.arange(width)},
    )
    ds["delta"].attrs["units"] = "nats (arm - control NLL of the same token)"
    ds.attrs.update(analysis="trajectory_nll", alpha=float(alpha), n_trajectories=int(n_traj),
                    rule="beyond the noise (within_noise False): the candidate's mean |delta| exceeds the A/A's and "
                         "the sign test over tokens (candidate's |delta| larger vs smaller than the repeat's at the "
                         "same token; ties dropped) has p < alpha. Tokens of one trajectory are correlated, so the "
                         "trajectory-level sign test (sign_p) is given beside it")
    return ds


def output_churn(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> dict:
    """How many of N free-running outputs differ between two runs: complete outputs and first tokens.

    Example
    -------
    >>> output_churn([[1, 2], [3, 4], [5]], [[1, 2], [3, 9], [6]])
    {'n': 3, 'outputs_changed': 2, 'first_tokens_changed': 1, 'first_difference': [None, 1, 0]}
    """
    if len(a) != len(b):
        raise KernelArgumentError(f"the runs hold {len(a)} and {len(b)} outputs", key="b",
                                  fix="pass the outputs of the same prompts, in the same order")
    changed, first_changed, where = 0, 0, []
    for x, y in zip(a, b):
        x, y = [int(t) for t in x], [int(t) for t in y]
        if x != y:
            changed += 1
            k = next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
            where.append(k)
            first_changed += int(k == 0)
        else:
            where.append(None)
    return {"n": len(a), "outputs_changed": changed, "first_tokens_changed": first_changed, "first_difference": where}


def describe_trajectory_noise(ds: xr.Dataset, churn: Mapping | None = None) -> str:
    """The finding in words, with the A/A yardstick beside each candidate number."""
    f, m = ds.first_token_mean_abs.values, ds.mean_delta.values
    ma = ds.mean_abs_delta.values
    n = ds.attrs['n_trajectories']
    s = (f"{n} fixed trajector{'y' if n == 1 else 'ies'}: first-token mean |NLL delta| {f[1]:.6g} candidate vs "
         f"control, {f[0]:.6g} between control repeats; all-token mean NLL delta {m[1]:+.6g} vs {m[0]:+.6g} "
         f"(mean |delta| {ma[1]:.6g} vs {ma[0]:.6g}); the candidate's |delta| is larger at "
         f"{int(ds.tokens_candidate_larger)} tokens and smaller at {int(ds.tokens_repeat_larger)} (sign test "
         f"p = {float(ds.sign_p_tokens):.4g}; per trajectory {int(ds.candidate_larger)} vs {int(ds.repeat_larger)}, "
         f"p = {float(ds.sign_p):.4g}): " + ("within the control's own noise" if bool(ds.within_noise)
                                             else "beyond the control's own noise"))
    if churn:
        s += (f"; across control repeats {churn['outputs_changed']}/{churn['n']} complete outputs and "
              f"{churn['first_tokens_changed']}/{churn['n']} first tokens change")
    return s


# ---------------------------------------------------------------------------------------------
# sources


def trajectory_nll_captures(control, repeat, candidate, *, logits: str | None = None,
                            tokens: str | None = None) -> tuple[xr.Dataset, dict]:
    """Per-token NLL of the control's tokens from each capture's logits, and the delta analysis.

    Each capture is one trajectory: its logits at step s (detected, or ``logits="op/name"``) score
    the control's token of step s (detected, or ``tokens="op/name"``; else the argmax of the
    control's logits). Only the steps up to the first where an arm's own token differs from the
    control's are scored (after that the arm was fed other text, unless it was teacher-forced, in
    which case its tokens equal the control's throughout).

    Returns
    -------
    (:func:`trajectory_nll` of the one trajectory, a dict with ``steps`` scored and ``tokens``).
    """
    import torch

    from workbench.analysis.logits import _arm_logits, _open
    from workbench.analysis.tokens import token_agreement

    caps = [_open(x) for x in (control, repeat, candidate)]
    rows = [_arm_logits(c, logits) for c in caps]
    steps = sorted(set.intersection(*(set(st.tolist()) for _, _, st in rows)))
    for other in caps[1:]:
        try:
            first = int(token_agreement(caps[0], other, tokens=tokens, logits=logits).attrs["first_differing_step"])
        except Exception:  # noqa: BLE001 - no token tensor: the argmax of the logits decides
            first = -1
        if first >= 0:
            steps = [s for s in steps if s <= first]
    if not steps:
        raise KernelArgumentError("the captures share no step with logits", key="logits",
                                  fix="capture the logits of the same steps in every arm")
    from workbench.analysis.tokens import _step_tokens, find_tokens, parse_tensor

    spec = parse_tensor(tokens, "tokens") if tokens else find_tokens(caps[0])
    by_step = (_step_tokens(caps[0], *spec, from_logits=False) if spec else
               _step_tokens(caps[0], *rows[0][0], from_logits=True))
    toks = [int(by_step[s][-1]) for s in steps]
    nll = []
    for (_, r, st) in rows:
        lp = torch.log_softmax(torch.stack([r[list(st).index(s)].double().reshape(-1) for s in steps]), -1)
        nll.append((-lp[torch.arange(len(steps)), torch.tensor(toks)]).numpy()[None])
    return trajectory_nll(*nll), {"steps": steps, "tokens": toks}


@contextlib.contextmanager
def hf_arm(model, *, splitk: int = 1, bf16: Sequence[str] = ()):
    """Run a Hugging Face (any torch) model as another arm, inside the ``with`` block only.

    ``splitk``: every ``nn.Linear`` computes ``x @ W.T`` as ``splitk`` K-slices summed in fp32
    (reassociation only: an A/A repeat with another GEMM tiling). ``bf16``: the modules with these
    names (``model.named_modules()``) run under CPU autocast to bf16 (their matmuls read bf16
    inputs and weights), the result cast back. The model's own forward methods are restored on exit.
    """
    import torch

    from workbench.kernels.gemm import splitk_matmul

    mods = dict(model.named_modules())
    missing = [n for n in bf16 if n not in mods]
    if missing:
        raise KernelArgumentError(f"the model has no module {missing[0]!r}", key="bf16",
                                  fix="name modules as model.named_modules() lists them, e.g. model.layers.1.self_attn.o_proj")
    saved = {}

    def patch(name, mod, fn):
        saved[name] = mod.forward
        mod.forward = fn

    for name, mod in mods.items():
        if name in bf16:
            def fwd(*args, _f=mod.forward, **kw):
                dt = next((a.dtype for a in args if torch.is_tensor(a) and a.is_floating_point()), torch.float32)
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = _f(*args, **kw)
                return out.to(dt) if torch.is_tensor(out) else out
            patch(name, mod, fwd)
        elif splitk > 1 and isinstance(mod, torch.nn.Linear):
            def fwd(x, _m=mod):
                shp = x.shape
                y = splitk_matmul(x.reshape(-1, shp[-1]).float(), _m.weight.float(), splits=splitk,
                                  partial_dtype="fp32", order="sequential", out_dtype="fp32")
                if _m.bias is not None:
                    y = y + _m.bias.float()
                return y.to(x.dtype).reshape(*shp[:-1], -1)
            patch(name, mod, fwd)
    try:
        yield model
    finally:
        for name, fn in saved.items():
            mods[name].forward = fn


def score_hf(model, prompt, continuation) -> np.ndarray:
    """Teacher-forced NLL (nats, FP64 log-softmax of the model's logits) of each continuation token."""
    import torch

    ids = torch.tensor([[int(t) for t in prompt] + [int(t) for t in continuation]])
    with torch.no_grad():
        logits = model(ids).logits[0]
    T, L = len(prompt), len(continuation)
    lp = torch.log_softmax(logits[T - 1:T - 1 + L].double(), -1)
    return (-lp[torch.arange(L), torch.tensor([int(t) for t in continuation])]).numpy()


def generate_hf(model, prompt, steps: int) -> list[int]:
    """Greedy continuation of ``prompt`` (first maximum), ``steps`` tokens, by full forward passes."""
    import torch

    ids = [int(t) for t in prompt]
    out = []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(torch.tensor([ids])).logits[0, -1]
            t = int(torch.argmax(logits))
            out.append(t)
            ids.append(t)
    return out


def score_trajectories(source, prompts: Sequence, arms: Mapping[str, object], *, steps: int) -> tuple[xr.Dataset, dict]:
    """Fixed trajectories from a model: the control generates each prompt's continuation (greedy,
    ``steps`` tokens), every arm scores it teacher-forced and generates its own.

    ``source``: a :class:`workbench.models.hybrid.HybridDecoder` (arms are
    :class:`~workbench.models.hybrid.ArmConfig`) or a Hugging Face causal LM (arms are dicts of
    :func:`hf_arm` keyword arguments, ``{}`` for the model as it is). ``arms`` must hold
    ``control``, ``repeat`` (the A/A) and ``candidate``.

    Returns
    -------
    (:func:`trajectory_nll`, ``{"outputs": {arm: [[token, ...], ...]}, "churn_repeat":
    output_churn(control, repeat), "churn_candidate": ...}``)
    """
    for k in ("control", "repeat", "candidate"):
        if k not in arms:
            raise KernelArgumentError(f"arms has no {k!r}", key="arms", fix="pass arms with control, repeat and candidate")
    hybrid = hasattr(source, "generate") and hasattr(source, "score")

    def gen(arm, p):
        if hybrid:
            return source.generate(p, steps=steps - 1, arm=arm)
        with hf_arm(source, **arm):
            return generate_hf(source, p, steps)

    def score(arm, p, cont):
        if hybrid:
            return source.score(p, cont, arm=arm)
        with hf_arm(source, **arm):
            return score_hf(source, p, cont)

    outputs = {k: [] for k in ("control", "repeat", "candidate")}
    nll = {k: [] for k in outputs}
    from workbench.progress import progress

    for p in progress(list(prompts), desc="trajectories", unit="prompt"):
        cont = gen(arms["control"], p)
        outputs["control"].append(cont)
        for k in outputs:
            nll[k].append(score(arms[k], p, cont))
            if k != "control":
                outputs[k].append(gen(arms[k], p))
    ds = trajectory_nll(nll["control"], nll["repeat"], nll["candidate"])
    return ds, {"outputs": outputs, "churn_repeat": output_churn(outputs["control"], outputs["repeat"]),
                "churn_candidate": output_churn(outputs["control"], outputs["candidate"])}


def trajectory_source(model: str, *, candidate: str, repeat_splitk: int = 2, n_prompts: int = 4,
                      prompt_len: int = 16, seed: int = 0):
    """The model, arms and prompts of :func:`score_trajectories` from text parameters.

    ``model``: ``"hybrid"`` (the bundled hybrid decoder; ``candidate`` is ``family.knob:value``
    changes, e.g. ``"gdn.state_dtype:bf16 qsa.prob_dtype:fp16"``) or ``"hf:PATH"`` (a Hugging Face
    causal LM built from the config.json at PATH, or the folder holding it, with random weights
    from ``seed``, fp32; ``candidate`` is the module names to run in bf16, comma-separated). The A/A
    repeat computes every projection in ``repeat_splitk`` K-slices (fp32 reassociation only).

    Returns ``(source, arms, prompts, description)``.
    """
    import torch

    if not isinstance(repeat_splitk, int) or repeat_splitk < 2:
        raise KernelArgumentError(f"repeat_splitk must be an int >= 2, got {repeat_splitk!r}", key="repeat_splitk",
                                  fix="pass 2 (a repeat that reassociates every projection's sum)")
    if model == "hybrid":
        from workbench.errors import WorkbenchError
        from workbench.models.hybrid import ArmConfig, arm_from_changes
        from workbench.models.sample import base_model
        from workbench.numerics.policy import Policy

        try:
            cand_arm = arm_from_changes(candidate, name="candidate")
        except WorkbenchError as e:
            raise KernelArgumentError(e.message, key="candidate", fix=e.fix) from None
        changes = {f: p for f, p in ((f, cand_arm.policy(f)) for f in ("gdn", "qsa", "proj", "lm_head"))
                   if p != ArmConfig().policy(f)}
        if not changes:
            raise KernelArgumentError("the hybrid candidate changes nothing", key="candidate",
                                      fix="pass e.g. candidate='gdn.state_dtype:bf16'")
        src = base_model()
        arms = {"control": ArmConfig(name="control"),
                "repeat": ArmConfig(name="repeat", proj=Policy(splitk=repeat_splitk)),
                "candidate": cand_arm}
        prompts = [src.prompt(prompt_len, seed=seed + i + 1) for i in range(n_prompts)]
        desc = (f"the bundled hybrid decoder; repeat: projections in {repeat_splitk} K-slices; candidate: "
                + ", ".join(f"{f} {p.label()}" for f, p in changes.items()))
        return src, arms, prompts, desc
    if model.startswith("hf:"):
        from pathlib import Path

        try:
            from transformers import AutoConfig, AutoModelForCausalLM
        except ImportError:
            raise KernelArgumentError("model='hf:...' needs transformers", key="model",
                                      fix="pip install transformers (in the dev extra)") from None
        path = Path(model[3:])
        cfg_dir = path if path.is_dir() else path.parent
        if not (cfg_dir / "config.json").is_file():
            raise KernelArgumentError(f"no config.json at {path}", key="model",
                                      fix="pass model='hf:path/to/config.json' (or the folder holding it)")
        cfg = AutoConfig.from_pretrained(str(cfg_dir))
        torch.manual_seed(seed)
        src = AutoModelForCausalLM.from_config(cfg).float().eval()
        names = [n.strip() for n in candidate.split(",") if n.strip()]
        if not names:
            raise KernelArgumentError("the HF candidate names no module", key="candidate",
                                      fix="pass the modules to run in bf16, e.g. candidate='model.layers.1.self_attn.o_proj'")
        arms = {"control": {}, "repeat": {"splitk": repeat_splitk}, "candidate": {"bf16": names}}
        g = torch.Generator().manual_seed(seed + 1)
        prompts = [torch.randint(0, int(cfg.vocab_size), (prompt_len,), generator=g) for _ in range(n_prompts)]
        desc = (f"{type(src).__name__} from {cfg_dir / 'config.json'} (random weights, seed {seed}); repeat: every "
                f"Linear in {repeat_splitk} K-slices; candidate: {', '.join(names)} in bf16")
        return src, arms, prompts, desc
    raise KernelArgumentError(f"unknown model {model!r}", key="model",
                              fix="pass 'hybrid', 'hf:path/to/config.json' or '' (skip)")
