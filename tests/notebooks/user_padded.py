"""A batched engine with a padding bug, and a golden model, written as captures.

Four prompts decode together, left-padded to the longest; the candidate engine forgets the
attention mask, so the one shorter prompt (seq 3) attends to its pad tokens and its decode
positions drift; the others have no padding and match the golden model up to batch-shape
arithmetic. Per decode step the candidate records its logits ``[4, V]`` and selected tokens
``[4]``; the golden arm (the same Hugging Face model, each sequence alone, unpadded, teacher-forced
on the candidate's tokens) records its logits ``[4, V]`` at the same steps."""

from __future__ import annotations

from pathlib import Path

import torch

from workbench.capture import CaptureWriter

PROMPT_LENS = (10, 10, 10, 6)
PADDED_SEQ = 3
STEPS = 4
PAD = 0


def tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).float().eval()


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(11)
    return [torch.randint(1, 96, (n,), generator=g).tolist() for n in PROMPT_LENS]


def write_padded_runs(root: Path) -> dict:
    model = tiny_model()
    ps = prompts()
    width = max(PROMPT_LENS)
    seqs = [[PAD] * (width - len(p)) + p for p in ps]  # left padding, as batched engines do
    selected = [[] for _ in ps]
    with CaptureWriter(root / "candidate", arm="candidate") as w, torch.no_grad():
        for step in range(STEPS):
            logits = model(torch.tensor(seqs)).logits[:, -1]  # the bug: no attention_mask, pads are attended
            toks = logits.argmax(-1)
            w.add(logits, step=step, op="logits", name="output")
            w.add(toks, step=step, op="sampler", name="token")
            for i, t in enumerate(toks.tolist()):
                seqs[i].append(t)
                selected[i].append(t)
    with CaptureWriter(root / "golden", arm="golden") as w, torch.no_grad():
        for step in range(STEPS):
            rows = [model(torch.tensor([p + s[:step]])).logits[0, -1] for p, s in zip(ps, selected)]
            w.add(torch.stack(rows), step=step, op="logits", name="output")
    model.save_pretrained(root / "model")
    return {"prompts": ps, "selected": selected}
