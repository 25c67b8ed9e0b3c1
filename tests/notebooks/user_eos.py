"""Two runs of a served model whose logits at one decode step carry the seed's EOS flip: EOS
0.760651 -> 0.839734 and newline 0.239349 -> 0.160266 (every other token below 1e-10), written
as an engine would (float32 logits `[V]` per step under op "logits", sampled tokens under
"sampler/token"), with a real byte-level BPE tokenizer.json (Hugging Face tokenizers) in which
EOS is the added token <|endoftext|> and newline the byte-level 'Ċ'. Prefixes agree up to the
flip step; there the same draw samples newline under control and EOS under candidate."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from workbench.capture import CaptureWriter

FLIP_STEP = 3
P_CONTROL = {"eos": 0.760651, "newline": 0.239349}
P_CANDIDATE = {"eos": 0.839734, "newline": 0.160266}


def write_tokenizer(path: Path) -> dict[str, int]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {c: i for i, c in enumerate(sorted(alphabet))}
    for w in ("Ġthe", "Ġanswer", "Ġis"):
        vocab[w] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path))
    return {"eos": tok.token_to_id("<|endoftext|>"), "newline": vocab["Ċ"], "V": tok.get_vocab_size()}


def write_eos_runs(root: Path) -> dict[str, int]:
    ids = write_tokenizer(root / "tokenizer.json")
    V = ids["V"]
    g = torch.Generator().manual_seed(7)
    prefix = torch.randn(FLIP_STEP, V, generator=g, dtype=torch.float64)
    for arm, probs, token in (("control", P_CONTROL, ids["newline"]), ("candidate", P_CANDIDATE, ids["eos"])):
        with CaptureWriter(root / arm, arm=arm) as w:
            for step in range(FLIP_STEP + 1):
                if step < FLIP_STEP:
                    row = prefix[step] + (1e-4 * step if arm == "candidate" else 0.0)
                    tok = int(row.argmax())
                else:
                    row = torch.full((V,), -40.0, dtype=torch.float64)
                    row[ids["eos"]] = math.log(probs["eos"])
                    row[ids["newline"]] = math.log(probs["newline"])
                    tok = token
                w.add(row.float(), step=step, op="logits", name="output")
                w.add(torch.tensor([tok], dtype=torch.int64), step=step, op="sampler", name="token")
    return ids
