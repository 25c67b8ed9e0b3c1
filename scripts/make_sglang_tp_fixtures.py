#!/usr/bin/env python
"""Write the SGLang TP fixtures with SGLang's own, unmodified dumper.

    python scripts/make_sglang_tp_fixtures.py [--wheel sglang-0.5.23-*.whl] [--out tests/fixtures/sglang_tp]

Without --wheel, `pip download sglang==0.5.23 --no-deps` fetches the wheel. Its
``sglang/srt/debug_utils/dumper.py`` is extracted as it is and imported beside stub modules for
what it imports from the rest of the engine (io_struct, runtime_context, utils, and the modules
its SGLang plugin needs to report parallel info: distributed, dp_attention, logits_processor,
forward_batch_info). A tiny decoder (embedding, 2 MLP blocks with residual, vocab-parallel
lm_head) runs 3 forward passes (a 5-token prefill, then 2 greedy decode steps) on CPU at TP=1 and
at TP=2 (two processes, torch.distributed's gloo backend, column-parallel up projection,
row-parallel down projection summed by an all-reduce), calling ``dumper.dump(name, tensor,
dims=..., layer_id=...)`` with the dims annotations SGLang's comparator reads. Three runs:

* ``tp1``: one rank;
* ``tp2``: the same weights and math on two ranks;
* ``tp2-bf16``: as tp2, but rank 1 rounds its layer-1 MLP partial sum to bf16 before the
  all-reduce (the planted fault: layer 1, rank 1, ``mlp_partial``).

The matmuls use float64 accumulation cast back to float32 so that TP1 and TP2 agree to within
the all-reduce's reassociation on any CPU.
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
DUMPER = "sglang/srt/debug_utils/dumper.py"
HIDDEN, INTER, VOCAB, LAYERS = 16, 32, 64, 2
PROMPT, DECODE = [3, 14, 15, 9, 26], 2

STUBS = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/debug_utils/__init__.py": "",
    "sglang/srt/managers/__init__.py": "",
    "sglang/srt/managers/io_struct.py": (
        "def sock_recv(sock):\n    raise RuntimeError('no dumper server in the fixture generator')\n"
        "def sock_send(sock, obj):\n    raise RuntimeError('no dumper server in the fixture generator')\n"
        "def wrap_as_pickle(obj):\n    raise RuntimeError('no dumper server in the fixture generator')\n"),
    "sglang/srt/runtime_context.py": (
        "import os\nfrom types import SimpleNamespace\n"
        "def get_parallel():\n"
        "    tp, size = int(os.environ['FIXTURE_TP_RANK']), int(os.environ['FIXTURE_TP_SIZE'])\n"
        "    return SimpleNamespace(tp_rank=tp, tp_size=size, pp_rank=0, pp_size=1, moe_ep_rank=0, moe_ep_size=1,\n"
        "                           moe_tp_rank=tp, moe_tp_size=size, moe_dp_rank=0, attn_tp_rank=tp, attn_tp_size=size,\n"
        "                           attn_dp_rank=0, attn_dp_size=1, attn_cp_rank=0, attn_cp_size=1)\n"
        "def get_server_args():\n    return None\n"
        "def get_serving():\n    return None\n"),
    "sglang/srt/utils.py": "def get_device():\n    return 'cpu'\n",
    "sglang/srt/distributed.py": "",
    "sglang/srt/layers/__init__.py": "",
    "sglang/srt/layers/dp_attention.py": (
        "def get_moe_cp_size():\n    return 1\n"
        "def is_dp_attention_enabled():\n    return False\n"),
    "sglang/srt/layers/logits_processor.py": "class LogitsProcessorOutput:\n    pass\n",
    "sglang/srt/model_executor/__init__.py": "",
    "sglang/srt/model_executor/forward_batch_info.py": (
        "class ForwardBatch:\n    pass\nclass PPProxyTensors:\n    pass\n"),
}

RUNS = {"tp1": (1, None), "tp2": (2, None), "tp2-bf16": (2, (1, 1))}  # name: (tp size, (layer, rank) in bf16)


def _weights():
    import torch

    g = torch.Generator().manual_seed(0)
    return {"embed": torch.randn(VOCAB, HIDDEN, generator=g),
            "up": [torch.randn(INTER, HIDDEN, generator=g) / HIDDEN ** 0.5 for _ in range(LAYERS)],
            "down": [torch.randn(HIDDEN, INTER, generator=g) / INTER ** 0.5 for _ in range(LAYERS)],
            "lm_head": torch.randn(VOCAB, HIDDEN, generator=g)}


def _mm(x, w):
    return (x.double() @ w.double().T).float()


def worker(rank: int, size: int, fault, init: str) -> None:
    """One TP rank: the decoder's forward passes with the dumper's intrusive calls."""
    import torch
    import torch.distributed as dist

    os.environ["FIXTURE_TP_RANK"], os.environ["FIXTURE_TP_SIZE"] = str(rank), str(size)
    if size > 1:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=size)
    from sglang.srt.debug_utils.dumper import dumper

    W = _weights()
    i_sl = slice(rank * INTER // size, (rank + 1) * INTER // size)
    v_sl = slice(rank * VOCAB // size, (rank + 1) * VOCAB // size)
    ids = list(PROMPT)
    feed = torch.tensor(ids)
    for _ in range(DECODE + 1):
        h = W["embed"][feed]
        dumper.dump("input_ids", feed, dims="t # tp:replicated")
        for layer in range(LAYERS):
            dumper.dump("layer_input", h, dims="t h # tp:replicated", layer_id=layer)
            up = torch.relu(_mm(h, W["up"][layer][i_sl]))
            dumper.dump("mlp_up", up, dims="t i[tp]", layer_id=layer)
            part = _mm(up, W["down"][layer][:, i_sl])
            if fault == (layer, rank):
                part = part.bfloat16().float()
            dumper.dump("mlp_partial", part, dims="t h[tp:partial]", layer_id=layer)
            out = part.clone()
            if size > 1:
                dist.all_reduce(out)
            dumper.dump("mlp_output", out, dims="t h # tp:replicated", layer_id=layer)
            h = h + out
        last = h[-1:]
        logits = _mm(last, W["lm_head"][v_sl])
        dumper.dump("logits", logits, dims="t v[tp]")
        full = [torch.empty_like(logits) for _ in range(size)]
        if size > 1:
            dist.all_gather(full, logits)
        else:
            full = [logits]
        token = torch.cat(full, -1).argmax(-1)
        dumper.dump("next_token_ids", token, dims="t # tp:replicated")
        dumper.step()
        ids.append(int(token))
        feed = token
    if size > 1:
        dist.barrier()
        dist.destroy_process_group()


def _spawn(rank, size, fault, init, src):
    sys.path.insert(0, src)
    worker(rank, size, fault, init)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", help=f"sglang-{VERSION} wheel (default: pip download it)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "sglang_tp"))
    a = ap.parse_args()
    import torch.multiprocessing as mp

    tmp = Path(tempfile.mkdtemp(prefix="sglang-fixtures-"))
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
        for name, (size, fault) in RUNS.items():
            os.environ.update(DUMPER_ENABLE="1", DUMPER_DIR=str(out), DUMPER_EXP_NAME=name,
                              DUMPER_ENABLE_OUTPUT_CONSOLE="0", DUMPER_NON_INTRUSIVE_MODE="off")
            init = f"file://{tmp / f'init-{name}'}"
            mp.spawn(_spawn, args=(size, fault, init, str(src)), nprocs=size, join=True)
            print(f"{name}: {len(list((out / name).glob('*.pt')))} files")
        (out / "README.md").write_text(
            f"Written by `python scripts/make_sglang_tp_fixtures.py` with SGLang {VERSION}'s own "
            f"`dumper.py` (see the script's docstring); do not edit by hand.\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
