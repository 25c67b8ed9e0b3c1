#!/usr/bin/env python
"""Write the FlashInfer API-logging fixtures with FlashInfer's own, unmodified ``api_logging.py``.

``flashinfer/api_logging.py`` is extracted from the flashinfer-python wheel (``pip download
flashinfer-python==VERSION --no-deps``) beside a stub ``flashinfer/__init__.py`` and
``flashinfer/version.py`` (all it imports from the package), and its ``@flashinfer_api``
decorator wraps CPU stand-ins named like FlashInfer's APIs: ``rmsnorm(input, weight, eps)``, a
``BatchDecodeWithPagedKVCacheWrapper`` whose ``plan()`` runs once per forward pass and whose
``run(q, paged_kv_cache, *, return_lse)`` runs once per layer (the KV cache passed as a
``(k, v)`` tuple, so the dump holds nested tensors), and ``top_k_sampling_from_probs``. A tiny
2-layer decoder (hidden 16, 2 heads of 8) prefills 4 tokens and decodes 2, with
``FLASHINFER_LOGLEVEL=10`` (level-10 dumps: one folder per call with ``inputs``/``outputs`` and
``metadata.jsonl``, and ``session.jsonl``):

* ``pt/control``: torch.save tensors (``FLASHINFER_DUMP_SAFETENSORS=0``, the default);
* ``pt/candidate``: the same, with the attention kernel writing layer 1's output in bf16 (the
  planted fault: step 0, layer 1, ``BatchDecodeWithPagedKVCacheWrapper.run`` ``output.0``);
* ``safetensors/control``: the control with ``FLASHINFER_DUMP_SAFETENSORS=1``;
* ``pt/tp2``: the control's math on two processes (heads split, partial outputs summed), one
  process id per rank.

Each run is a fresh interpreter (the logger reads its environment at import). Regenerate with
``python scripts/make_flashinfer_fixtures.py``; the folder names carry the run's timestamps and
process ids, so they differ at every regeneration (the tensors do not).
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

VERSION = "0.7.4"
ROOT = Path(__file__).resolve().parents[1]
LOGGER = "flashinfer/api_logging.py"
STUBS = {"flashinfer/__init__.py": "", "flashinfer/version.py": f"__version__ = {VERSION!r}\n"}
RUNS = {  # name: (format, fault layer, processes)
    "pt/control": ("torch", None, 1),
    "pt/candidate": ("torch", 1, 1),
    "safetensors/control": ("safetensors", None, 1),
    "pt/tp2": ("torch", None, 2),
}
HIDDEN, HEADS, HEAD_DIM, LAYERS, VOCAB, PROMPT, DECODE = 16, 2, 8, 2, 32, 4, 2

MODEL = r'''
import os, sys, torch
from flashinfer.api_logging import flashinfer_api

HIDDEN, HEADS, HEAD_DIM, LAYERS, VOCAB, PROMPT, DECODE = {dims}
FAULT = {fault}
RANK, SIZE = int(sys.argv[1]), int(sys.argv[2])


@flashinfer_api
def rmsnorm(input, weight, eps=1e-6):
    x = input.double()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()).float()


class BatchDecodeWithPagedKVCacheWrapper:
    @flashinfer_api
    def plan(self, num_tokens, num_heads, head_dim):
        self.n, self.h, self.d, self.layer = num_tokens, num_heads, head_dim, 0

    @flashinfer_api
    def run(self, q, paged_kv_cache, *, return_lse=False):
        k, v = paged_kv_cache
        s = torch.einsum("thd,shd->hts", q.double(), k.double()) / HEAD_DIM ** 0.5
        T, S = q.shape[0], k.shape[0]
        mask = torch.arange(S)[None, :] > (torch.arange(T)[:, None] + S - T)
        s = s.masked_fill(mask, float("-inf"))
        lse = torch.logsumexp(s, -1)
        o = torch.einsum("hts,shd->thd", torch.softmax(s, -1), v.double()).float()
        if FAULT == self.layer:  # the candidate kernel's build writes this layer's output in bf16
            o = o.bfloat16().float()
        self.layer += 1
        return (o, lse.float().t().contiguous()) if return_lse else o


@flashinfer_api
def top_k_sampling_from_probs(probs, top_k):
    return torch.topk(probs, top_k, dim=-1).indices[:, 0]


g = torch.Generator().manual_seed(0)
W = dict(embed=torch.randn(VOCAB, HIDDEN, generator=g), lm=torch.randn(VOCAB, HIDDEN, generator=g) / HIDDEN ** 0.5)
for i in range(LAYERS):
    for n in ("q", "k", "v", "o"):
        W[f"{{n}}{{i}}"] = torch.randn(HIDDEN, HIDDEN, generator=g) / HIDDEN ** 0.5
    W[f"norm{{i}}"] = 1 + 0.1 * torch.randn(HIDDEN, generator=g)
W["final"] = torch.ones(HIDDEN)
heads = range(RANK * HEADS // SIZE, (RANK + 1) * HEADS // SIZE)
cols = torch.cat([torch.arange(h * HEAD_DIM, (h + 1) * HEAD_DIM) for h in heads])
if SIZE > 1:
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=sys.argv[3], rank=RANK, world_size=SIZE)
wrapper = BatchDecodeWithPagedKVCacheWrapper()
ids = torch.randint(0, VOCAB, (PROMPT,), generator=torch.Generator().manual_seed(1))
cache = {{}}
for step in range(DECODE + 1):
    x = W["embed"][ids]
    wrapper.plan(int(ids.shape[0]), len(heads), HEAD_DIM)
    for i in range(LAYERS):
        h = rmsnorm(x, W[f"norm{{i}}"])
        q, k, v = ((h.double() @ W[f"{{n}}{{i}}"][cols].double().T).float().reshape(-1, len(heads), HEAD_DIM)
                   for n in "qkv")
        kc, vc = cache.get(i, (k[:0], v[:0]))
        kc, vc = torch.cat([kc, k]), torch.cat([vc, v])
        cache[i] = (kc, vc)
        o, lse = wrapper.run(q, (kc, vc), return_lse=True)
        y = (o.reshape(o.shape[0], -1).double() @ W[f"o{{i}}"][:, cols].double().T).float()
        if SIZE > 1:
            dist.all_reduce(y)
        x = x + y
    hl = rmsnorm(x[-1:], W["final"])
    probs = torch.softmax((hl.double() @ W["lm"].double().T).float(), -1)
    ids = top_k_sampling_from_probs(probs, 1)
if SIZE > 1:
    dist.barrier()
    dist.destroy_process_group()
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", help=f"flashinfer-python-{VERSION} wheel (default: pip download it)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "flashinfer"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="flashinfer-fixtures-"))
    try:
        wheel = a.wheel
        if not wheel:
            subprocess.run([sys.executable, "-m", "pip", "download", f"flashinfer-python=={VERSION}", "--no-deps",
                            "-q", "-d", str(tmp / "wheel")], check=True)
            wheel = str(next((tmp / "wheel").glob("flashinfer_python-*.whl")))
        src = tmp / "src"
        for rel, text in STUBS.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_text(text)
        with zipfile.ZipFile(wheel) as z:
            (src / LOGGER).write_bytes(z.read(LOGGER))  # the engine's own logger, unmodified
        out = Path(a.out)
        if out.exists():
            shutil.rmtree(out)
        for name, (fmt, fault, procs) in RUNS.items():
            script = tmp / f"model-{name.replace('/', '-')}.py"
            script.write_text(MODEL.format(dims=(HIDDEN, HEADS, HEAD_DIM, LAYERS, VOCAB, PROMPT, DECODE), fault=fault))
            env = {**os.environ, "PYTHONPATH": str(src), "FLASHINFER_LOGLEVEL": "10",
                   "FLASHINFER_LOGDEST": str(tmp / "log.txt"), "FLASHINFER_DUMP_DIR": str(out / name),
                   "FLASHINFER_DUMP_SAFETENSORS": "1" if fmt == "safetensors" else "0",
                   "CUDA_VISIBLE_DEVICES": ""}
            init = f"file://{tmp / ('init-' + name.replace('/', '-'))}"
            ps = [subprocess.Popen([sys.executable, str(script), str(r), str(procs), init], env=env)
                  for r in range(procs)]
            if any(p.wait() for p in ps):
                raise SystemExit(f"{name}: the model run failed")
            print(f"{name}: {sum(1 for _ in (out / name).glob('*_call*'))} call folders")
        (out / "README.md").write_text(
            f"Written by `python scripts/make_flashinfer_fixtures.py` with FlashInfer {VERSION}'s own "
            f"`api_logging.py` (see the script's docstring); do not edit by hand.\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
