#!/usr/bin/env python
"""Write SGLang dumper fixtures of one request served alone and inside a batch, with the request
ids SGLang's default ``core`` mode dumps.

    python scripts/make_sglang_batch_fixtures.py [--wheel sglang-0.5.23-*.whl] [--out tests/fixtures/sglang_batch]

SGLang 0.5.23's own ``sglang/srt/debug_utils/dumper.py`` (unmodified, from ``pip download
sglang==0.5.23 --no-deps``) runs beside the stubs of ``scripts/make_sglang_tp_fixtures.py`` (a
``ForwardBatch`` with ``input_ids``, ``positions``, ``seq_lens``, ``req_pool_indices`` and
``rids``). ``dumper.register_non_intrusive_dumper(model)`` in its default ``core`` mode dumps
the forward batch's core fields at every forward pass, among them ``rids``: a list of request-id
strings, not a tensor. The tiny decoder (embedding, 2 layers of per-request causal attention and
MLP, lm_head) also calls ``dumper.dump("attn_output"/"mlp_output", ..., layer_id=i)``. Runs:

* ``alone``: request ``req-A`` (5 prompt tokens) prefilled, then 2 greedy decode steps;
* ``batch``: ``req-B`` (3 tokens) and ``req-A`` prefilled together in one pass (rows of B first),
  then both decoded for 2 steps: A's rows sit at other row indices in every pass.

Every op is per row or per request and accumulates in float64, so A's rows are the same in both
runs; aligned by (request, position) they compare equal, step by step they do not even match in
shape.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_sglang_tp_fixtures import DUMPER, STUBS, VERSION  # noqa: E402  the same engine stubs

ROOT = Path(__file__).resolve().parents[1]
STUBS = {**STUBS, "sglang/srt/model_executor/forward_batch_info.py": (
    "class ForwardBatch:\n"
    "    def __init__(self, input_ids, positions, seq_lens, req_pool_indices, rids):\n"
    "        self.input_ids, self.positions, self.seq_lens = input_ids, positions, seq_lens\n"
    "        self.req_pool_indices, self.rids = req_pool_indices, rids\n"
    "class PPProxyTensors:\n    pass\n")}
RUNS = {"alone": ["req-A"], "batch": ["req-B", "req-A"]}

MODEL = r'''
import os, sys, torch
from torch import nn
os.environ["FIXTURE_TP_RANK"], os.environ["FIXTURE_TP_SIZE"] = "0", "1"
from sglang.srt.debug_utils.dumper import dumper
from sglang.srt.model_executor.forward_batch_info import ForwardBatch

H, V, L = 16, 64, 2
PROMPTS = {{"req-A": [3, 14, 15, 9, 26], "req-B": [5, 35, 8]}}
RIDS = {rids}
g = torch.Generator().manual_seed(0)
W = {{"embed": torch.randn(V, H, generator=g), "lm": torch.randn(V, H, generator=g) / H ** 0.5}}
for i in range(L):
    for n in ("q", "k", "v", "o", "up", "down"):
        W[f"{{n}}{{i}}"] = torch.randn(H, H, generator=g) / H ** 0.5


def mm(x, w):
    return torch.stack([(r.double() @ w.double().T).float() for r in x])  # row by row: batch-invariant


class Tiny(nn.Module):
    def forward(self, input_ids, positions, forward_batch):
        x = W["embed"][input_ids]
        cache = self.cache
        for i in range(L):
            q, k, v = (mm(x, W[f"{{n}}{{i}}"]) for n in "qkv")
            out, a = [], 0
            for rid, n in zip(forward_batch.rids, self.rows):
                kc = cache.setdefault((rid, i, "k"), [])
                vc = cache.setdefault((rid, i, "v"), [])
                kc.extend(k[a:a + n]); vc.extend(v[a:a + n])
                K, Vv = torch.stack(kc).double(), torch.stack(vc).double()
                for j in range(n):
                    p = int(positions[a + j])
                    s = (q[a + j].double() @ K[:p + 1].T) / H ** 0.5
                    out.append((torch.softmax(s, -1) @ Vv[:p + 1]).float())
                a += n
            attn = mm(torch.stack(out), W[f"o{{i}}"])
            dumper.dump("attn_output", attn, layer_id=i)
            x = x + attn
            m = mm(torch.relu(mm(x, W[f"up{{i}}"])), W[f"down{{i}}"])
            dumper.dump("mlp_output", m, layer_id=i)
            x = x + m
        last = torch.stack([x[sum(self.rows[:j + 1]) - 1] for j in range(len(self.rows))])
        return mm(last, W["lm"])


model = Tiny()
model.cache = {{}}
dumper.register_non_intrusive_dumper(model)
seqs = {{r: list(PROMPTS[r]) for r in RIDS}}
feed = {{r: list(PROMPTS[r]) for r in RIDS}}
with torch.no_grad():
    for step in range(3):
        ids, pos, rows = [], [], []
        for r in RIDS:
            start = len(seqs[r]) - len(feed[r])
            ids += feed[r]; pos += list(range(start, len(seqs[r]))); rows.append(len(feed[r]))
        model.rows = rows
        fb = ForwardBatch(torch.tensor(ids), torch.tensor(pos), torch.tensor([len(seqs[r]) for r in RIDS]),
                          torch.arange(len(RIDS)), list(RIDS))
        logits = model(torch.tensor(ids), torch.tensor(pos), fb)
        for r, t in zip(RIDS, logits.argmax(-1).tolist()):
            seqs[r].append(t); feed[r] = [t]
        dumper.step()
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", help=f"sglang-{VERSION} wheel (default: pip download it)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "sglang_batch"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sglang-batch-fixtures-"))
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
            (src / DUMPER).write_bytes(z.read(DUMPER))  # the engine's own dumper, unmodified
        out = Path(a.out)
        if out.exists():
            shutil.rmtree(out)
        for name, rids in RUNS.items():
            script = tmp / f"model-{name}.py"
            script.write_text(MODEL.format(rids=rids))
            env = {**os.environ, "PYTHONPATH": str(src), "DUMPER_ENABLE": "1", "DUMPER_DIR": str(out),
                   "DUMPER_EXP_NAME": name, "DUMPER_ENABLE_OUTPUT_CONSOLE": "0"}
            subprocess.run([sys.executable, str(script)], check=True, env=env)
            print(f"{name}: {len(list((out / name).glob('*.pt')))} files")
        (out / "README.md").write_text(
            f"Written by `python scripts/make_sglang_batch_fixtures.py` with SGLang {VERSION}'s own "
            f"`dumper.py` (see the script's docstring); do not edit by hand.\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
