#!/usr/bin/env python
"""Write the SGLang forward-hook dump fixtures with SGLang's own, unmodified hook dumper.

    python scripts/make_sglang_hook_fixtures.py [--wheel sglang-0.5.23-*.whl] [--out tests/fixtures/sglang_hooks]

``sglang/srt/debug_utils/tensor_dump_forward_hook.py`` (what ``--debug-tensor-dump-output-folder``
turns on) is extracted from the wheel (``pip download sglang==0.5.23 --no-deps``) and imported
beside stubs for the three classes it imports from the engine (``LogitsProcessorOutput``,
``ForwardBatch``, ``PPProxyTensors``). ``register_forward_hook_for_model`` hooks a tiny decoder
laid out as SGLang's models are (``XxxForCausalLM`` holding ``model`` with ``embed_tokens``,
``layers.<i>.{input_layernorm, self_attn.{qkv_proj, o_proj}, post_attention_layernorm,
mlp.{gate_up_proj, down_proj}}``, ``norm``, then ``lm_head`` and ``logits_processor``), which
prefills 5 tokens and decodes 2 (three forward passes, ``Pass00000.pt``...). The dumper writes
one ``TP{tp}_PP{pp}_Rank{rank}_pid{pid}/Pass{n}.pt`` per pass: a dict of every leaf module's
output, the ``ForwardBatch``'s input_ids, seq_lens and positions; the root module's output and
what runs after it (lm_head, logits) land in the *next* pass's file, as SGLang's hook order makes
them. Two runs:

* ``control``;
* ``candidate``: layer 1's ``mlp.down_proj`` output rounded to bf16 (the planted fault).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "0.5.23"
HOOKS = "sglang/srt/debug_utils/tensor_dump_forward_hook.py"
STUBS = {
    "sglang/__init__.py": "", "sglang/srt/__init__.py": "", "sglang/srt/debug_utils/__init__.py": "",
    "sglang/srt/layers/__init__.py": "", "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/layers/logits_processor.py": (
        "class LogitsProcessorOutput:\n"
        "    def __init__(self, next_token_logits):\n"
        "        self.next_token_logits = next_token_logits\n"),
    "sglang/srt/model_executor/forward_batch_info.py": (
        "class ForwardBatch:\n"
        "    def __init__(self, input_ids, seq_lens, positions):\n"
        "        self.input_ids, self.seq_lens, self.positions = input_ids, seq_lens, positions\n"
        "class PPProxyTensors:\n"
        "    def __init__(self, tensors):\n"
        "        self.tensors = tensors\n"),
}
RUNS = {"control": None, "candidate": 1}  # name: layer whose down_proj output is rounded to bf16

MODEL = r'''
import sys, torch
from torch import nn
from sglang.srt.debug_utils.tensor_dump_forward_hook import register_forward_hook_for_model
from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

H, I, V, L, HEADS = 16, 32, 64, 2, 2
FAULT = {fault}
torch.manual_seed(0)


def mm(x, w):
    return (x.double() @ w.double().T).float()


class Linear(nn.Module):
    def __init__(self, n, k, fault=False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, k) / k ** 0.5, requires_grad=False)
        self.fault = fault

    def forward(self, x):
        y = mm(x, self.weight)
        return y.bfloat16().float() if self.fault else y


class RMSNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(H), requires_grad=False)

    def forward(self, x):
        x64 = x.double()
        return (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight.double()).float()


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv_proj, self.o_proj = Linear(3 * H, H), Linear(H, H)
        self.k, self.v = None, None

    def forward(self, positions, x):
        q, k, v = self.qkv_proj(x).split(H, -1)
        self.k = k if positions[0] == 0 else torch.cat([self.k, k])
        self.v = v if positions[0] == 0 else torch.cat([self.v, v])
        d = H // HEADS
        qh, kh, vh = (t.reshape(t.shape[0], HEADS, d).transpose(0, 1).double() for t in (q, self.k, self.v))
        s = qh @ kh.transpose(1, 2) / d ** 0.5
        mask = torch.arange(kh.shape[1])[None, :] > positions[:, None]
        o = torch.softmax(s.masked_fill(mask, float("-inf")), -1) @ vh
        return self.o_proj(o.transpose(0, 1).reshape(x.shape[0], H).float())


class MLP(nn.Module):
    def __init__(self, fault):
        super().__init__()
        self.gate_up_proj, self.down_proj = Linear(2 * I, H), Linear(H, I, fault=fault)

    def forward(self, x):
        g, u = self.gate_up_proj(x).split(I, -1)
        return self.down_proj(torch.nn.functional.silu(g) * u)


class DecoderLayer(nn.Module):
    def __init__(self, i):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(), RMSNorm()
        self.self_attn, self.mlp = Attention(), MLP(FAULT == i)

    def forward(self, positions, x):
        x = x + self.self_attn(positions, self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Embedding(V, H)
        self.layers = nn.ModuleList([DecoderLayer(i) for i in range(L)])
        self.norm = RMSNorm()

    def forward(self, input_ids, positions, forward_batch):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(positions, x)
        return self.norm(x)


class LogitsProcessor(nn.Module):
    def forward(self, hidden, lm_head):
        return LogitsProcessorOutput(next_token_logits=mm(hidden[-1:], lm_head.weight))


class TinyForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Model()
        self.lm_head = Linear(V, H)
        self.logits_processor = LogitsProcessor()

    def forward(self, input_ids, positions, forward_batch):
        return self.logits_processor(self.model(input_ids, positions, forward_batch), self.lm_head)


net = TinyForCausalLM()
with torch.no_grad():
    net.model.embed_tokens.weight.requires_grad_(False)
register_forward_hook_for_model(net, sys.argv[1], dump_layers=None, tp_size=1, tp_rank=0, pp_rank=0)
ids, pos = torch.tensor([3, 14, 15, 9, 26]), torch.arange(5)
with torch.no_grad():
    for _ in range(3):
        out = net(ids, pos, ForwardBatch(ids, torch.tensor([int(pos[-1]) + 1]), pos))
        ids = out.next_token_logits.argmax(-1)
        pos = pos[-1:] + 1
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", help=f"sglang-{VERSION} wheel (default: pip download it)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "sglang_hooks"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sglang-hook-fixtures-"))
    try:
        wheel = a.wheel
        if not wheel:
            subprocess.run([sys.executable, "-m", "pip", "download", f"sglang=={VERSION}", "--no-deps", "-q",
                            "-d", str(tmp / "wheel")], check=True)
            wheel = str(next((tmp / "wheel").glob("sglang-*.whl")))
        src = tmp / "src"
        for rel, text in STUBS.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_text(text)
        with zipfile.ZipFile(wheel) as z:
            (src / HOOKS).write_bytes(z.read(HOOKS))  # the engine's own hook dumper, unmodified
        out = Path(a.out)
        if out.exists():
            shutil.rmtree(out)
        for name, fault in RUNS.items():
            script = tmp / f"model-{name}.py"
            script.write_text(MODEL.format(fault=fault))
            subprocess.run([sys.executable, str(script), str(out / name)], check=True,
                           env={**os.environ, "PYTHONPATH": str(src)})
            print(f"{name}: {sorted(p.name for p in (out / name).rglob('*.pt'))}")
        (out / "README.md").write_text(
            f"Written by `python scripts/make_sglang_hook_fixtures.py` with SGLang {VERSION}'s own "
            f"`tensor_dump_forward_hook.py` (see the script's docstring); do not edit by hand.\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
