"""Captures the workbench never made, for the notebooks' discovery tests.

A tiny random Hugging Face Llama (vocab 2048) whose lm_head rows 333 and 1777 are set so that,
at decode step 1 only, their FP64 logits are 20.01 and 20.04: both round to 20.0 in bf16 (BF16
ULP 0.125 there), so an arm that materializes logits in bf16 picks 333 by the tie rule while
FP64 (and an fp32 arm) picks 1777. The rows are orthogonal to step 0's hidden state, so step 0
is untouched. Recorded with ``workbench.record`` (``lm_head/input``, ``lm_head/output``, every
layer; no expectation metadata), the lm_head weight saved as a safetensors checkpoint shard, and
the same runs written again as SGLang dumper files (``{"value", "meta"}`` .pt files named by
``___``-joined fields, the engine's own names ``logits_processor.output`` and
``next_token_ids``), imported with ``workbench import sglang``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

LOW, HIGH = 333, 1777
TIE_STEP = 1
LOW_LOGIT, HIGH_LOGIT = 20.01, 20.04
IDS = [[3, 14, 15, 9, 26, 5, 35]]
NEW_TOKENS = 4


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def _lm_inputs(model) -> list[torch.Tensor]:
    seen = []
    h = model.lm_head.register_forward_pre_hook(lambda m, a: seen.append(a[0][0, -1].detach().double().clone()))
    with torch.no_grad():
        model.generate(torch.tensor(IDS), max_new_tokens=TIE_STEP + 1, min_new_tokens=TIE_STEP + 1, do_sample=False)
    h.remove()
    return seen


def planted_model():
    """The model with the tie planted at step ``TIE_STEP`` (rows orthogonal to earlier steps' states)."""
    model = _model()
    hs = _lm_inputs(model)
    basis = torch.stack(hs[:TIE_STEP], 0)  # earlier hidden states: the rows give them logit 0
    q, _ = torch.linalg.qr(basis.T)
    target = hs[TIE_STEP] - q @ (q.T @ hs[TIE_STEP])
    W = model.lm_head.weight.data
    for tok, value in ((LOW, LOW_LOGIT), (HIGH, HIGH_LOGIT)):
        W[tok] = (target * (value / float(target @ hs[TIE_STEP]))).float()
    return model


def _record(model, path: Path, arm: str):
    import workbench

    with torch.no_grad(), workbench.record(model, path, arm=arm, include=["model.layers.*", "lm_head"],
                                           exclude=["*rotary_emb*"]):
        out = model.generate(torch.tensor(IDS), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(IDS[0]):].tolist()


def to_sglang_dump(capture, folder: Path, tokens: list[int]) -> Path:
    """Write a capture's tensors as SGLang dumper files: module tensors as
    ``model.layers.<i>.<op>.<name>``, the lm_head as ``logits_processor``, the sampled tokens as
    ``next_token_ids`` (int64), each a ``{"value": tensor, "meta": {...}}`` .pt file."""
    from workbench.capture.importers.sglang import format_dump_name

    folder.mkdir(parents=True, exist_ok=True)
    di = 0
    for step in sorted(capture.index["step"].unique().tolist()):
        rows = capture.index[capture.index["step"] == step].sort_values("seq")
        items = []
        for _, r in rows.iterrows():
            t = capture._tensor(r)
            op = "logits_processor" if r["op"] == "lm_head" else r["op"]
            io = {"input": "inputs.0", "output": "output"}.get(r["name"], r["name"])
            prefix = f"model.layers.{int(r['layer'])}." if r["layer"] >= 0 else ""
            items.append((f"{prefix}{op}.{io}", t))
        items.append(("next_token_ids", torch.tensor([tokens[step]], dtype=torch.int64)))
        for name, t in items:
            di += 1
            fields = dict(step=step, rank=0, dump_index=di, name=name)
            torch.save({"value": t, "meta": {**fields, "tp_size": 1}}, folder / format_dump_name(fields))
    return folder


def write_user_lm(d: Path) -> dict:
    """Every capture of the module docstring under ``d``; returns their paths and facts."""
    from safetensors.torch import save_file

    from workbench.capture import open_capture
    from workbench.capture.importers import import_capture

    model = planted_model()
    save_file({"lm_head.weight": model.lm_head.weight.detach().contiguous()}, str(d / "model.safetensors"))
    control = copy.deepcopy(model)
    control.lm_head.register_forward_hook(lambda m, a, out: out.to(torch.bfloat16))  # the sampler sees bf16
    toks = {"hf-control": _record(control, d / "hf-control", "control"),
            "hf-repeat": _record(control, d / "hf-repeat", "control-repeat"),
            "hf-candidate": _record(model, d / "hf-candidate", "candidate")}
    for arm in ("control", "candidate"):
        to_sglang_dump(open_capture(d / f"hf-{arm}"), d / f"sglang-dump-{arm}", toks[f"hf-{arm}"])
        import_capture("sglang", d / f"sglang-dump-{arm}", d / f"sg-{arm}", arm=arm)
    return {"dir": d, "tokens": toks, "weight": d / "model.safetensors"}
