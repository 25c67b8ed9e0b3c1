"""Per-element throughput of ``workbench.numerics.metrics.compare`` (the fused numba kernel).

Cases at ``--n`` elements (default 64M), median of ``--repeats`` timed calls after one warm-up:
bf16 identical, bf16 / fp32 / fp16 with 1e-3 absolute noise on randn. Throughput is reported in
GB/s per arm (bytes of one tensor / seconds) and elements/s. ``--old PATH`` also times the
``compare`` of another copy of metrics.py (e.g. ``git show <rev>:workbench/numerics/metrics.py``
saved outside the repo) in the same run. Prints one JSON object; ``--out`` also writes it.

    python benchmarks/compare_kernel.py [--n 67108864] [--repeats 3] [--old /tmp/old_metrics.py]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.numerics import metrics  # noqa: E402


def cases(n: int):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(n, generator=g)
    noise = 1e-3 * torch.randn(n, generator=g)
    b = a + noise
    yield "bf16_identical", a.bfloat16(), a.bfloat16()
    yield "bf16_noisy", a.bfloat16(), b.bfloat16()
    yield "fp32_noisy", a, b
    yield "fp16_noisy", a.half(), b.half()


def timed(fn, a, b, repeats: int) -> float:
    fn(a, b)  # compile / load numba's cache, fault the pages in
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(a, b)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def load_module(path: str):
    spec = importlib.util.spec_from_file_location("old_metrics", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_metrics"] = mod
    spec.loader.exec_module(mod)
    return mod


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1 << 26)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--old", default=None, help="path of another metrics.py to time alongside")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    impls = {"new": metrics.compare}
    if args.old:
        impls["old"] = load_module(args.old).compare
    res = {}
    for name, a, b in cases(args.n):
        row = {}
        for impl, fn in impls.items():
            t = timed(fn, a, b, args.repeats)
            row[impl] = {"s": round(t, 4), "gb_s_per_arm": round(a.numel() * a.element_size() / t / 1e9, 3),
                         "melem_s": round(a.numel() / t / 1e6, 1)}
        if "old" in row:
            row["speedup"] = round(row["old"]["s"] / row["new"]["s"], 2)
        res[name] = row
        print(name, json.dumps(row), file=sys.stderr, flush=True)
    out = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "numba_threads": numba.get_num_threads()},
        "load_before_after": None,
        "versions": {"python": platform.python_version(), "numba": numba.__version__, "numpy": np.__version__,
                     "torch": torch.__version__},
        "n": args.n, "repeats": args.repeats, "results": res,
    }
    out["load_before_after"] = [load0, os.getloadavg()]
    out["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip()
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    load0 = os.getloadavg()
    main()
