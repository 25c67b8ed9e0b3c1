"""The bundled sample captures (``workbench samples``): arms of the hybrid decoder and a tiny
Hugging Face Qwen3-Next, each with the finding a user should make in it.

Every capture's run metadata holds ``description``, the model and arm configuration, the sampled
``tokens`` and, for a candidate, ``expect``: the planted first divergence (``first_divergence``,
a key), how to see it (``how``: the compare call) and a one-line explanation (``why``). The
catalogue is :data:`CAPTURES`; docs/models.md describes each entry.

Regeneration is bitwise reproducible on any x86-64 CPU (AVX2 or AVX-512, Intel or AMD): the
captures are recorded in a child process with the portable arithmetic of
:mod:`workbench.numerics.portable` (fixed seeds, baseline ATen kernels, MKL's reproducible path,
one thread), and each capture's ``run["arithmetic"]`` records what the bits still depend on (the
torch version and the C library).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
import os
from pathlib import Path
from typing import Any, Callable

import torch

from workbench.capture.writer import CaptureWriter
from workbench.kernels.registry import kernel_log
from workbench.models.hybrid import ArmConfig, HybridConfig, HybridDecoder, Override, RecordSpec
from workbench.numerics.policy import Policy

__all__ = ["CAPTURES", "PAIRS", "SampleCapture", "write_samples", "base_model", "tie_model", "splitk_model",
           "PROMPT_LEN", "DECODE_STEPS", "TIE", "SPLITK"]

PROMPT_LEN, DECODE_STEPS = 256, 64
REGENERATE = "workbench samples --out captures"

# drift needs every step; the other families keep every internal tensor only at the detail steps,
# and the QSA layers' sparse decode inputs (paged K/V cache, block table) at the same steps, so that
# replay(op="qsa") replays them (2 QSA layers x 2 ranks x 9 steps: 36 cases)
MAIN_SPEC = RecordSpec(qsa_cache_steps=RecordSpec().detail_steps)
LIGHT_SPEC = RecordSpec(detail_steps=(0, 1, 2, 3, 16, 64),
                        every_step=("lm_head/input", "lm_head/logits", "sampler/token"))
# the layout pair records layers 0 and 3's MLP in full (inputs, per-rank partials, weights) for the
# sharding replay, and every step's token rows, so that a chunked-prefill arm aligns by position
LAYOUT_SPEC = dataclasses.replace(LIGHT_SPEC, mlp_detail=(0, 3), batch_rows=True)
# the chunked arm prefills 128 + 128: its steps are the control's plus one (the first chunk), so
# it records the same decode steps in full one step later, and the GDN conv windows
CHUNKED_SPEC = dataclasses.replace(LAYOUT_SPEC, detail_steps=(0, 1, 2, 3, 4, 17, 65), conv_state=True)
# the lm_head weight lets the notebooks compute FP64 logits from the tensors (hidden @ weight)
SPLITK_SPEC = dataclasses.replace(LIGHT_SPEC, lm_head_weight=True)

# the tie of DESIGN.md: two fp64 logits that round to the same bf16 value (11.125); greedy takes
# the lower index although the higher one has the larger fp64 logit
TIE = {"low_id": 67, "high_id": 692, "low_logit": 11.11763134, "high_logit": 11.14099662}
# split-K flip: fp64 logits either side of the bf16 rounding boundary 11.15625 (between 11.125 and
# 11.1875); lo_id < hi_id, so a tie after bf16 rounding also goes to lo_id
SPLITK = {"lo_id": 305, "hi_id": 811, "lo_logit": 11.1520, "hi_logit": 11.1605, "flip_splits": 9,
          "pass_splits": 16, "partial_dtype": "bf16"}


def base_model() -> HybridDecoder:
    return HybridDecoder(HybridConfig())


def _prefill_hidden(model: HybridDecoder, arm: ArmConfig) -> torch.Tensor:
    """The lm_head input ``[1, D]`` at step 0 (it does not depend on the lm_head)."""

    class Grab:
        h = None

        def add(self, t, *, op, name, **_):
            if op == "lm_head" and name == "input":
                Grab.h = t.clone()

    model.generate(model.prompt(PROMPT_LEN), steps=0, arm=arm, writer=Grab(),
                   spec=RecordSpec(detail_steps=(), every_step=("lm_head/input",)))
    return Grab.h


def _row_for(h64: torch.Tensor, target: float, noise: torch.Tensor | None = None) -> torch.Tensor:
    """An fp32 lm_head row whose fp64 logit with ``h`` is ``target`` (noise orthogonal to h)."""
    row = h64 * (target / float(h64 @ h64))
    if noise is not None:
        row = row + noise - h64 * (float(noise @ h64) / float(h64 @ h64))
    return row.float()


def tie_model(arm: ArmConfig) -> tuple[HybridDecoder, dict]:
    """The base model with lm_head rows 67 and 692 planted so their step-0 logits tie in bf16."""
    model = base_model()
    h = _prefill_hidden(model, arm)[0].double()
    W = model.weights["lm_head"].clone()
    W[TIE["low_id"]] = _row_for(h, TIE["low_logit"])
    W[TIE["high_id"]] = _row_for(h, TIE["high_logit"])
    fp64 = (h @ W.double().T)
    info = {"step": 0, "fp64_logits": {str(t): float(fp64[t]) for t in (TIE["low_id"], TIE["high_id"])},
            "bf16_logit": float(fp64[TIE["low_id"]].to(torch.bfloat16)),
            "greedy_bf16": TIE["low_id"], "argmax_fp64": TIE["high_id"],
            "nats_lost": float(fp64[TIE["high_id"]] - fp64[TIE["low_id"]]),
            "other_max_fp64": float(torch.cat([fp64[:TIE["low_id"]], fp64[TIE["low_id"] + 1:TIE["high_id"]],
                                               fp64[TIE["high_id"] + 1:]]).max())}
    return model.with_weights(lm_head=W), info


def _lm_token(h: torch.Tensor, W: torch.Tensor, splits: int, partial: str) -> int:
    from workbench.kernels import gemm, sampling
    y = gemm.splitk_matmul(h, W, splits=splits, partial_dtype=partial, out_dtype="fp32")
    return int(sampling.greedy(y.to(torch.bfloat16)))


def splitk_model(arm: ArmConfig) -> tuple[HybridDecoder, dict]:
    """The base model with two lm_head rows planted so that, at step 0, 9 split-K slices with bf16
    partials flip the greedy token and 16 do not (found by a seeded search over row components
    orthogonal to the hidden state, which change the partials but not the exact logits)."""
    model = base_model()
    h32 = _prefill_hidden(model, arm)
    h = h32[0].double()
    lo, hi = SPLITK["lo_id"], SPLITK["hi_id"]
    g = torch.Generator().manual_seed(1234)
    for attempt in range(200):
        W = model.weights["lm_head"].clone()
        W[lo] = _row_for(h, SPLITK["lo_logit"], torch.randn(h.shape[0], generator=g, dtype=torch.float64) * 0.3)
        W[hi] = _row_for(h, SPLITK["hi_logit"], torch.randn(h.shape[0], generator=g, dtype=torch.float64) * 0.3)
        ok = (_lm_token(h32, W, 1, "fp32") == hi and _lm_token(h32, W, SPLITK["pass_splits"], "bf16") == hi
              and _lm_token(h32, W, SPLITK["flip_splits"], "bf16") == lo)
        if ok:
            break
    else:  # pragma: no cover - the search is seeded and succeeds
        raise RuntimeError("no split-K flip found")
    fp64 = h @ W.double().T
    table = {str(s): _lm_token(h32, W, s, "bf16") for s in range(1, 33)}
    info = {"step": 0, "attempt": attempt, "fp64_logits": {str(lo): float(fp64[lo]), str(hi): float(fp64[hi])},
            "argmax_fp64": hi, "token_by_splits_bf16_partials": table,
            "flipping_splits_bf16_partials": [int(s) for s, t in table.items() if t != hi],
            "fp32_partials_flip": [s for s in range(1, 33) if _lm_token(h32, W, s, "fp32") != hi]}
    return model.with_weights(lm_head=W), info


@dataclass(frozen=True)
class SampleCapture:
    """One bundled capture: its arm, the model builder, what to record and what to find."""

    name: str
    arm: ArmConfig
    description: str
    spec: RecordSpec = MAIN_SPEC
    model: str = "base"          # "base", "tie", "splitk" (hybrid) or "hf" (Qwen3-Next)
    control: str | None = None   # the capture to compare against (None: this is a control)
    aa: str | None = None        # the A/A repeat to pass as aa=
    expect: dict | None = None   # planted first divergence and the explanation
    rules: list = field(default_factory=list)


_C = ArmConfig(name="control")
_T4 = ArmConfig(name="tp4-control", tp=4)

CAPTURES: dict[str, SampleCapture] = {c.name: c for c in [
    SampleCapture("control", _C, "reference run of the hybrid decoder: 2 simulated TP ranks, fp32 "
                  "projections (split-K 1), QSA with 2 KV splits and fp32 probabilities, fp32 GDN state, "
                  "bf16 logits, greedy"),
    SampleCapture("control-repeat", _C.replace(name="control-repeat", proj=Policy(splitk=2)),
                  "A/A repeat of the control: every projection reduced in 2 K-slices (fp32 reassociation "
                  "only, as a different GEMM tiling would); use as aa= to get per-key noise floors",
                  control="control",
                  expect={"first_divergence": None,
                          "why": "run-to-run noise only: every key differs by fp32 reassociation and the "
                                 "greedy tokens are the same"}),
    SampleCapture("candidate", _C.replace(name="candidate", qsa=Policy(num_kv_splits=2, prob_dtype="fp16")),
                  "candidate: the QSA kernel materializes attention probabilities in fp16 before P.V",
                  control="control", aa="control-repeat",
                  expect={"first_divergence": {"rank": 0, "step": 0, "layer": 3, "op": "qsa", "name": "partial_o"},
                          "why": "layer 3 is the first QSA layer; its per-split outputs carry the fp16 "
                                 "rounding of P (index scores and selected tokens are still equal)"}),
    SampleCapture("candidate-bf16-state", _C.replace(name="candidate-bf16-state", gdn=Policy(state_dtype="bf16")),
                  "candidate: the GDN recurrent state is stored in bf16 between chunks and decode steps",
                  control="control", aa="control-repeat",
                  expect={"first_divergence": {"rank": 0, "step": 0, "layer": 0, "op": "gdn", "name": "core"},
                          "state_drift": "grows",
                          "why": "the first GDN layer's output after the first chunk boundary reads a "
                                 "bf16-rounded state; the state error grows over the decode steps "
                                 "(gdn/state, every step)"}),
    SampleCapture("tie-control", _C.replace(name="tie-control"),
                  "two logits tie after bf16 rounding at step 0 (tokens 67 and 692 both 11.125); greedy "
                  "takes the lower index 67 although 692 has the larger fp64 logit",
                  spec=SPLITK_SPEC, model="tie"),
    SampleCapture("tie-candidate", _C.replace(name="tie-candidate", lm_head=Policy(logits_dtype="fp32")),
                  "the tie model with fp32 logits: the tie is gone and greedy takes 692",
                  spec=SPLITK_SPEC, model="tie", control="tie-control",
                  expect={"first_divergence": {"rank": 0, "step": 0, "layer": -1, "op": "lm_head", "name": "logits"},
                          "why": "logits materialized in fp32 instead of bf16; the sampler then picks 692 "
                                 "instead of 67 at step 0 (FP64 logits in run['tie'])"}),
    SampleCapture("splitk-control", _C.replace(name="splitk-control", lm_head=Policy(splitk=16, partial_dtype="bf16")),
                  "lm_head as 16 split-K slices with bf16 partials (fp32 math); the greedy token at step 0 "
                  "agrees with fp64",
                  spec=SPLITK_SPEC, model="splitk"),
    SampleCapture("splitk-flip", _C.replace(name="splitk-flip", lm_head=Policy(splitk=9, partial_dtype="bf16")),
                  "lm_head as 9 split-K slices with bf16 partials: the greedy token at step 0 flips from 811 "
                  "to 305",
                  spec=SPLITK_SPEC, model="splitk", control="splitk-control",
                  expect={"first_divergence": {"rank": 0, "step": 0, "layer": -1, "op": "lm_head", "name": "logits"},
                          "why": "bf16 partial sums of 9 slices move logit 305 across the bf16 rounding "
                                 "boundary; the sampler picks 305 instead of 811 at step 0 (run['splitk'])"}),
    SampleCapture("tp1-control", ArmConfig(name="tp1-control", tp=1),
                  "the tp4 pair's model on one rank: the layout reference (per-rank tensors carry dims specs in "
                  "the TP4 captures, so they compare as logical tensors)", spec=LAYOUT_SPEC),
    SampleCapture("tp1-chunked", ArmConfig(name="tp1-chunked", tp=1, prefill_chunk=128),
                  "tp1-control with the 256-token prompt prefilled in two chunks of 128 (steps 0 and 1); its "
                  "token rows carry request and position, so it compares with tp1-control position by position",
                  spec=CHUNKED_SPEC, control="tp1-control",
                  expect={"first_divergence": None,
                          "why": "a chunked prefill carries the GDN state and conv window, and the QSA KV cache, "
                                 "across the chunk boundary in fp32, and the GDN kernel's chunks of 64 fall on the "
                                 "same boundaries: aligned by position, every tensor equals the unchunked "
                                 "prefill's bit for bit and the tokens are identical; compared step by step, "
                                 "the first chunk's tensors would be taken for the whole prompt's"}),
    SampleCapture("tp4-control", _T4, "the control on 4 simulated TP ranks", spec=LAYOUT_SPEC,
                  control="tp1-control",
                  expect={"first_divergence": None, "sharding": "down-only",
                          "why": "the same math on 4 ranks: every logical tensor (heads concatenated, the KV "
                                 "and GDN q/k heads grouped, the all-reduce's fp32 reassociation) agrees with TP1 "
                                 "to fp32 noise; compared rank by rank the ranks' head tensors do not even match "
                                 "in shape. Its MLP replayed on one device is reproduced bitwise by down-only "
                                 "sharding (the down projection's K split over the 4 ranks, fp32 partials summed "
                                 "in rank order)"}),
    SampleCapture("tp4-candidate", _T4.replace(name="tp4-candidate",
                                               overrides=(Override("qsa", {"input_dtype": "bf16"}, ranks=(2,)),)),
                  "4 TP ranks; rank 2 alone runs a QSA kernel build that reads q, K and V in bf16",
                  spec=LAYOUT_SPEC, control="tp4-control",
                  expect={"first_divergence": {"rank": 2, "step": 0, "layer": 3, "op": "qsa", "name": "partial_o"},
                          "why": "only rank 2's QSA heads differ (q, k, v are equal: the kernel rounds them on read); ranks 0, 1 and 3 agree until the "
                                 "all-reduce mixes rank 2's output into every rank's residual"}),
    SampleCapture("hf-qwen3next-control", ArmConfig(name="hf-qwen3next-control"),
                  "a tiny random Hugging Face Qwen3-Next recorded with workbench.record; GDN by the "
                  "model's own torch_chunk/recurrent_gated_delta_rule", model="hf"),
    SampleCapture("hf-qwen3next-candidate", ArmConfig(name="hf-qwen3next-candidate"),
                  "the same model with the workbench GDN kernels (gdn.chunked / gdn.recurrent, torch "
                  "backend, fp32 policy) patched into the linear-attention layers",
                  model="hf", control="hf-qwen3next-control",
                  expect={"first_divergence": None,
                          "first_difference": {"rank": 0, "step": 0, "layer": 0, "op": "linear_attn.norm",
                                               "name": "input"},
                          "why": "the two GDN implementations agree to fp32 noise (rel_l2 ~1e-7, under the "
                                 "default 1e-3): no divergence, same tokens; with an exact rule "
                                 "(threshold 0) the first difference is the GDN core output, i.e. the input "
                                 "of layer 0's gated norm"}),
]}

# (control, candidate, aa) for every pair with a finding
PAIRS = [(c.control, c.name, c.aa) for c in CAPTURES.values() if c.control is not None]


def _arm_metadata(c: SampleCapture, model: HybridDecoder) -> dict[str, Any]:
    return {"model": "workbench.models.hybrid.HybridDecoder", "config": model.config.to_dict(),
            "arm": c.arm.to_dict(), "record": c.spec.to_dict(), "prompt": {"length": PROMPT_LEN, "seed": 1},
            "decode_steps": DECODE_STEPS}


def _write_hybrid(c: SampleCapture, path: Path, arithmetic: dict) -> None:
    extra: dict[str, Any] = {}
    if c.model == "tie":
        model, extra["tie"] = tie_model(c.arm)
    elif c.model == "splitk":
        model, extra["splitk"] = splitk_model(c.arm)
    else:
        model = base_model()
    run = {"description": c.description, **_arm_metadata(c, model), **extra, "regenerate": REGENERATE,
           "arithmetic": arithmetic}
    if c.control is not None:
        run["compare_with"] = {"control": c.control, "aa": c.aa}
    if c.expect is not None:
        run["expect"] = _expect(c)
    w = CaptureWriter(path, arm=c.name, run=run, overwrite=True)
    try:
        with kernel_log() as log:  # which backend (and code path) computed each op, in the capture
            tokens = model.generate(model.prompt(PROMPT_LEN), steps=DECODE_STEPS, arm=c.arm, writer=w, spec=c.spec)
    except BaseException:
        w.abort()
        raise
    w.run["tokens"] = tokens
    w.run["kernels"] = log.summary()
    w.close()


def _expect(c: SampleCapture) -> dict:
    how = f"workbench compare captures/{c.control} captures/{c.name}" + (f" --aa captures/{c.aa}" if c.aa else "")
    return {**c.expect, "how": how}


def write_samples(out: str | Path = "captures", *, overwrite: bool = False,
                  only: list[str] | None = None, portable: bool = True) -> list[Path]:
    """Record the bundled captures under ``out``; returns their paths.

    ``only`` restricts to some names of :data:`CAPTURES`. An existing capture is replaced only with
    ``overwrite=True`` (atomically, when the new one is complete: see CaptureWriter).
    ``portable`` (default) computes in a child process with :mod:`workbench.numerics.portable`'s
    environment, so that the captures are the same bits on every x86-64 CPU; ``portable=False``
    records in this process with whatever kernels torch picked for this CPU.
    """
    from workbench.errors import CaptureError
    from workbench.numerics import portable as _portable

    out = Path(out)
    names = [n for n in CAPTURES if only is None or n in only]
    unknown = sorted(set(only or ()) - set(CAPTURES))
    if unknown:
        raise CaptureError(f"unknown sample capture(s) {unknown}", key="only", fix=f"choose from {sorted(CAPTURES)}")
    for name in names:
        path = out / name
        if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
            raise CaptureError("capture directory exists", file=path, fix="pass overwrite=True (workbench samples does)")
    if portable and not _portable.is_portable()[0]:
        # one single-threaded child per core (the bits do not depend on the split)
        jobs = max(1, min(len(names), os.cpu_count() or 1, 4))
        groups = [names[i::jobs] for i in range(jobs)]
        opts = ["--out", str(out), *(["--overwrite"] if overwrite else [])]
        _portable.run_portable("workbench.models.sample", [], parallel=[[*opts, *g] for g in groups if g])
        return [out / n for n in names]
    if portable:
        _portable.enter_portable()
    arithmetic = _portable.arithmetic()
    paths = []
    for name in names:
        c = CAPTURES[name]
        path = out / name
        if c.model == "hf":
            from workbench.models.hf_qwen3next import write_hf_capture
            write_hf_capture(c, path, regenerate=REGENERATE, arithmetic=arithmetic)
        else:
            _write_hybrid(c, path, arithmetic)
        paths.append(path)
    return paths


def _main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m workbench.models.sample",
                                 description="record the bundled sample captures (portable arithmetic)")
    ap.add_argument("--out", default="captures")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("names", nargs="*")
    a = ap.parse_args(argv)
    write_samples(a.out, overwrite=a.overwrite, only=a.names or None)
    return 0


if __name__ == "__main__":  # the child process of write_samples(portable=True)
    raise SystemExit(_main())
