"""What checksum-on-read costs: compare_captures with and without ``verify=True``, side by side.

Builds a control and a candidate capture (bf16 activations and fp32 states, the candidate off by
small noise) of ``--gb`` GB each, then, alternating in one process after a warm-up run (numba's
cache filled, shards in the page cache):

- ``plain``: ``compare_captures(control, candidate)`` (every manifest entry and shard header checked);
- ``verify``: ``compare_captures(control, candidate, verify=True)`` (plus each shard's sha256 once);
- ``sha256``: hashing the shards alone, and a numpy copy of as many bytes (the memory ceiling).

Usage::

    python benchmarks/checksum_on_read.py --dir /tmp/wb-sha [--gb 0.5] [--repeats 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build(d: Path, gb: float) -> int:
    from workbench.capture import CaptureWriter

    shutil.rmtree(d, ignore_errors=True)
    g = torch.Generator().manual_seed(0)
    per_layer = 2048 * 4096 * 2 + 32 * 128 * 128 * 4
    layers = max(1, int(gb * 1e9 // per_layer))
    with CaptureWriter(d / "control", arm="control", shard_bytes=64 << 20) as wc, \
            CaptureWriter(d / "candidate", arm="candidate", shard_bytes=64 << 20) as wd:
        for layer in range(layers):
            for name, t in (("hidden", torch.randn(2048, 4096, generator=g).bfloat16()),
                            ("state", torch.randn(32, 128, 128, generator=g))):
                wc.add(t, layer=layer, op="block", name=name)
                noisy = (t.float() + 1e-3 * torch.randn(t.shape, generator=g)).to(t.dtype)
                wd.add(noisy, layer=layer, op="block", name=name)
    return sum(p.stat().st_size for p in (d / "control").glob("*.safetensors"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/wb-sha")
    ap.add_argument("--gb", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    from workbench.analysis.compare import compare_captures
    from workbench.numerics.portable import cpu_name

    d = Path(a.dir)
    nbytes = build(d, a.gb)
    compare_captures(d / "control", d / "candidate", verify=True)  # warm-up: JIT cache, page cache
    times = {"plain": [], "verify": [], "sha256": [], "numpy_copy": []}
    shards = sorted((d / "control").glob("*.safetensors")) + sorted((d / "candidate").glob("*.safetensors"))
    buf = np.empty(nbytes * 2, dtype=np.uint8)
    src = np.ones_like(buf)
    for _ in range(a.repeats):
        for mode in ("plain", "verify"):
            t0 = time.perf_counter()
            res = compare_captures(d / "control", d / "candidate", verify=(mode == "verify"))
            times[mode].append(time.perf_counter() - t0)
            assert len(res.table) > 0
        t0 = time.perf_counter()
        for p in shards:
            h = hashlib.sha256()
            with open(p, "rb") as f:
                while b := f.read(8 << 20):
                    h.update(b)
        times["sha256"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        np.copyto(buf, src)
        times["numpy_copy"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    gbs = {k: 2 * nbytes / 1e9 / v for k, v in med.items()}  # both arms' bytes
    out = {
        "benchmark": "checksum_on_read", "command": " ".join([sys.executable.split("/")[-1], *sys.argv]),
        "date": dt.date.today().isoformat(), "machine": {"cpu": cpu_name(), "cores": os.cpu_count()},
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__},
        "bytes_per_arm": nbytes, "repeats": a.repeats, "median_s": med, "GB_per_s_both_arms": gbs,
        "verify_overhead": med["verify"] / med["plain"],
    }
    print(json.dumps(out, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
