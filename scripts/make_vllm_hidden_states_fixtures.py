#!/usr/bin/env python
"""Write vLLM hidden-states connector fixtures with vLLM's own connector code.

    python scripts/make_vllm_hidden_states_fixtures.py [--wheel vllm-0.33.0-*.whl] [--out tests/fixtures/vllm_hidden_states]

vLLM 0.33 has no per-layer tensor dump; the nearest is ``ExampleHiddenStatesConnector``
(``vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py``, with the
``extract_hidden_states`` speculative method): the chosen layers' hidden states are cached in a
KV-cache-shaped buffer ``[blocks, layers, block_size, hidden]`` and, when a request finishes,
``extract_from_kv_cache`` gathers its token slots and ``_write_tensors`` saves
``<request_id>.safetensors`` holding ``hidden_states [T, layers, hidden]`` and ``token_ids [T]``.
That module is extracted from the wheel (``pip download vllm==0.33.0 --no-deps``) unmodified and
imported beside stubs for the vLLM modules it imports; its own two functions gather and write
the files. The hidden states come from a tiny random Hugging Face Llama (4 layers, hidden 32,
``output_hidden_states=True``), layers 1, 2 and 3 (the aux-layer ids), for two prompts:

* ``control``: requests with random ids, in one order;
* ``candidate``: other random ids, the prompts in the other order, and layer 2's MLP computed in
  bf16 (the planted fault: layer 2's hidden states differ, layer 1's do not).

Request ids are random in real serving, so the importer pairs requests by their prompt tokens.
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
VERSION = "0.33.0"
CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
STUBS = {
    "vllm/__init__.py": "", "vllm/distributed/__init__.py": "", "vllm/distributed/kv_transfer/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/v1/__init__.py": "",
    "vllm/distributed/kv_transfer/kv_connector/v1/base.py": (
        "import enum\n"
        "class KVConnectorBase_V1:\n    pass\n"
        "class KVConnectorMetadata:\n    pass\n"
        "class KVConnectorRole(enum.Enum):\n    SCHEDULER = 0\n    WORKER = 1\n"
        "class SupportsHMA:\n    pass\n"),
    "vllm/config.py": "class VllmConfig:\n    pass\ndef get_layers_from_vllm_config(*a, **k):\n    return {}\n",
    "vllm/distributed/parallel_state.py": "def get_tensor_model_parallel_rank():\n    return 0\n",
    "vllm/logger.py": "import logging\ndef init_logger(name):\n    return logging.getLogger(name)\n",
    "vllm/utils/__init__.py": "",
    "vllm/utils/gpu_sync_debug.py": (
        "import contextlib\n@contextlib.contextmanager\ndef gpu_sync_allowed():\n    yield\n"),
    "vllm/v1/__init__.py": "", "vllm/v1/attention/__init__.py": "",
    "vllm/v1/attention/backend.py": "class AttentionMetadata:\n    pass\n",
    "vllm/v1/core/__init__.py": "", "vllm/v1/core/sched/__init__.py": "",
    "vllm/v1/core/sched/output.py": "class SchedulerOutput:\n    pass\n",
}
RUNS = {"control": (None, False, 11), "candidate": (2, True, 22)}  # name: (bf16 MLP layer, reversed order, id seed)

MODEL = r'''
import sys, uuid, random, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector, extract_from_kv_cache)

FAULT, REVERSE, SEED = {fault}, {reverse}, {seed}
AUX, BLOCK = [1, 2, 3], 4
out = Path(sys.argv[1])
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(cfg).eval()
if FAULT is not None:
    mlp = model.model.layers[FAULT].mlp
    fwd = mlp.forward
    mlp.forward = lambda x: fwd(x.bfloat16().float()).bfloat16().float()
prompts = [[5, 17, 3, 99, 42, 8, 61], [12, 7, 7, 30, 2]]
if REVERSE:
    prompts = prompts[::-1]
rng = random.Random(SEED)


class Done:  # the copy-done CUDA event the connector waits on; nothing is in flight on CPU
    def synchronize(self):
        pass


for prompt in prompts:
    with torch.no_grad():
        hs = model(torch.tensor([prompt]), output_hidden_states=True).hidden_states
    # the connector's cache-only layer: [blocks, aux layers, block size, hidden], this request's
    # tokens in shuffled blocks
    T = len(prompt)
    nblocks = -(-T // BLOCK)
    blocks = rng.sample(range(8), nblocks)
    cache = torch.zeros(8, len(AUX), BLOCK, cfg.hidden_size)
    for t in range(T):
        b, o = blocks[t // BLOCK], t % BLOCK
        cache[b, :, o] = torch.stack([hs[l + 1][0, t] for l in AUX])  # hidden_states[l + 1]: after layer l
    slots = (torch.arange(BLOCK)[None, :] + torch.tensor(blocks)[:, None] * BLOCK).flatten()
    hidden = extract_from_kv_cache(cache, slots, T)
    req_id = str(uuid.UUID(int=rng.getrandbits(128)))
    out.mkdir(parents=True, exist_ok=True)
    ExampleHiddenStatesConnector._write_tensors({{"hidden_states": hidden.contiguous(),
                                                 "token_ids": torch.tensor(prompt)}},
                                                Done(), str(out / f"{{req_id}}.safetensors"), None)
'''


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", help=f"vllm-{VERSION} wheel (default: pip download it)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "vllm_hidden_states"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="vllm-fixtures-"))
    try:
        wheel = a.wheel
        if not wheel:
            subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={VERSION}", "--no-deps", "-q",
                            "-d", str(tmp / "wheel")], check=True)
            wheel = str(next((tmp / "wheel").glob("vllm-*.whl")))
        src = tmp / "src"
        for rel, text in STUBS.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_text(text)
        with zipfile.ZipFile(wheel) as z:
            (src / CONNECTOR).write_bytes(z.read(CONNECTOR))  # the engine's own connector, unmodified
        out = Path(a.out)
        if out.exists():
            shutil.rmtree(out)
        for name, (fault, rev, seed) in RUNS.items():
            script = tmp / f"model-{name}.py"
            script.write_text(MODEL.format(fault=fault, reverse=rev, seed=seed))
            subprocess.run([sys.executable, str(script), str(out / name)], check=True,
                           env={**os.environ, "PYTHONPATH": str(src)})
            print(f"{name}: {sorted(p.name for p in (out / name).iterdir())}")
        (out / "README.md").write_text(
            f"Written by `python scripts/make_vllm_hidden_states_fixtures.py` with vLLM {VERSION}'s own "
            f"`example_hidden_states_connector.py` (see the script's docstring); do not edit by hand.\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
