#!/usr/bin/env python
"""Write the SGLang gradient fixtures with SGLang's own, unmodified dumper.

    python scripts/make_sglang_grad_fixtures.py [--wheel sglang-0.5.23-*.whl] [--out tests/fixtures/sglang_grad]

The dumper and its stubs come from ``make_sglang_tp_fixtures.py`` (the same wheel, extracted as
it is). A tiny decoder of 3 MLP blocks with residual, on one CPU process, sets the layer the way
SGLang's models do, ``dumper.set_ctx(layer_id=i)`` around each block (not a ``layer_id=`` argument
of each call), dumps ``layer_input`` and ``mlp_output`` there and ``logits`` after the stack, with
``DUMPER_ENABLE_GRAD=1``; a cross-entropy loss on the next token is then back-propagated. The
dumper's gradient hooks write ``grad__layer_input`` and ``grad__mlp_output`` when the backward
reaches each tensor, but they keep the call's own arguments only, not the context: the gradient
files carry no ``layer_id`` (what the workbench's importer recovers, see
:mod:`workbench.capture.importers.sglang`). Two runs of one forward and backward each:

* ``control``;
* ``candidate``: layer 1's MLP output rounded to bf16 (the planted fault: layer 1 ``mlp_output``
  forward; in the backward every gradient below the loss differs through the changed activations).

Float64 accumulation cast back to float32 keeps the files the same on any CPU.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("make_sglang_tp_fixtures", Path(__file__).with_name("make_sglang_tp_fixtures.py"))
tp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tp)

HIDDEN, INTER, VOCAB, LAYERS = 16, 32, 64, 3
PROMPT = [3, 14, 15, 9, 26]
RUNS = {"control": None, "candidate": 1}  # name: the layer whose MLP output is rounded to bf16


def _mm(x, w):
    return (x.double() @ w.double().T).float()


def run(fault) -> None:
    import torch

    from sglang.srt.debug_utils.dumper import dumper

    g = torch.Generator().manual_seed(0)
    embed = torch.randn(VOCAB, HIDDEN, generator=g)
    up = [torch.randn(INTER, HIDDEN, generator=g).div(HIDDEN ** 0.5).requires_grad_() for _ in range(LAYERS)]
    down = [torch.randn(HIDDEN, INTER, generator=g).div(INTER ** 0.5).requires_grad_() for _ in range(LAYERS)]
    lm_head = torch.randn(VOCAB, HIDDEN, generator=g)
    ids = torch.tensor(PROMPT)
    h = embed[ids[:-1]]
    for layer in range(LAYERS):
        dumper.set_ctx(layer_id=layer)  # as SGLang's decoder layers do
        dumper.dump("layer_input", h)
        out = _mm(torch.relu(_mm(h, up[layer])), down[layer])
        if fault == layer:
            out = out.bfloat16().float()
        dumper.dump("mlp_output", out)
        h = h + out
        dumper.set_ctx(layer_id=None)
    logits = _mm(h, lm_head)
    dumper.dump("logits", logits)
    loss = torch.nn.functional.cross_entropy(logits, ids[1:])
    loss.backward()
    dumper.step()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", help=f"sglang-{tp.VERSION} wheel (default: pip download it)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "sglang_grad"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="sglang-grad-fixtures-"))
    try:
        wheel = a.wheel
        if not wheel:
            subprocess.run([sys.executable, "-m", "pip", "download", f"sglang=={tp.VERSION}", "--no-deps", "-q",
                            "-d", str(tmp / "wheel")], check=True)
            wheel = str(next((tmp / "wheel").glob("sglang-*.whl")))
        src = tmp / "src"
        for rel, text in tp.STUBS.items():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            (src / rel).write_text(text)
        with zipfile.ZipFile(wheel) as z:
            (src / tp.DUMPER).write_bytes(z.read(tp.DUMPER))  # the engine's own dumper, unmodified
        out = Path(a.out)
        if out.exists():
            shutil.rmtree(out)
        for name, fault in RUNS.items():
            env = dict(os.environ, DUMPER_ENABLE="1", DUMPER_ENABLE_GRAD="1", DUMPER_DIR=str(out),
                       DUMPER_EXP_NAME=name, DUMPER_ENABLE_OUTPUT_CONSOLE="0", DUMPER_NON_INTRUSIVE_MODE="off",
                       FIXTURE_TP_RANK="0", FIXTURE_TP_SIZE="1", PYTHONPATH=str(src))
            # one process per run: the dumper is a module-level singleton configured from the environment
            subprocess.run([sys.executable, __file__, "--child", name], env=env, check=True)
            print(f"{name}: {len(list((out / name).glob('*.pt')))} files")
        (out / "README.md").write_text(
            f"Written by `python scripts/make_sglang_grad_fixtures.py` with SGLang {tp.VERSION}'s own "
            f"`dumper.py` (see the script's docstring); do not edit by hand.\n")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        run(RUNS[sys.argv[2]])
        sys.exit(0)
    sys.exit(main())
