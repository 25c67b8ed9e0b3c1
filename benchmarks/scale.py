"""compare_captures at scale: one process, a local dask cluster, and what N machines would give.

Side by side in one run, on data written here:

- ``ceiling``: this machine's memory bandwidth (numpy copy between two pre-faulted arrays, and a
  read-only sum), the bound no comparison of in-memory bytes beats;
- ``large``: two captures of ``--gb`` GB each (bf16 activations, fp32 projections and GDN states
  over ``--ranks`` ranks x ``--steps`` steps; odd layers differ by 1e-3 noise, even layers are
  bitwise equal), compared in a fresh process (``cold``: the first call pays numba's on-disk cache
  load and the shard header checks) and again in it (``warm``); the peak memory growth of that
  process against the budget 2 x the largest tensor + 256 MB;
- ``small``: ``--keys`` tiny tensors per arm (64 elements, bf16 and fp32), opened and compared in a
  fresh process;
- ``workers``: the large comparison on a ``LocalCluster`` of ``--workers`` processes (the cluster's
  start and the workers' first call reported apart from the comparison), the table checked equal
  to the local one;
- ``projection``: the time on N machines from the measured cost and bytes of each (rank, step)
  partition compared alone (longest-processing-time schedule), plus the measured driver-side
  merge and per-task overhead: the limits a cluster does not remove are the slowest partition
  and the driver's merge.

Usage::

    python benchmarks/scale.py [--gb 2] [--ranks 2] [--steps 2] [--keys 100000] [--workers 2] [--dir /tmp/wb-scale]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAMES = [("hidden", (2048, 4096), "bf16"), ("mlp_act", (2048, 12288), "bf16"), ("qkv", (2048, 2048), "fp32"),
         ("state", (32, 128, 128), "fp32")]


def _torch_dtype(name):
    import torch
    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def build_large(d: Path, gb: float, ranks: int, steps: int) -> dict:
    import torch

    from workbench.capture import CaptureWriter

    per_layer = sum(torch.Size(s).numel() * (2 if t == "bf16" else 4) for _, s, t in NAMES)
    layers = max(1, int(gb * 1e9 // (per_layer * ranks * steps)))
    g = torch.Generator().manual_seed(0)
    total = 0
    with CaptureWriter(d / "control", arm="control", overwrite=True) as wc, \
            CaptureWriter(d / "candidate", arm="candidate", overwrite=True) as wd:
        for step in range(steps):
            for rank in range(ranks):
                for layer in range(layers):
                    for name, shape, t in NAMES:
                        a = torch.randn(shape, generator=g)
                        b = a + 1e-3 * torch.randn(shape, generator=g) if layer % 2 else a
                        a, b = a.to(_torch_dtype(t)), b.to(_torch_dtype(t))
                        wc.add(a, rank=rank, step=step, layer=layer, op="layer", name=name)
                        wd.add(b, rank=rank, step=step, layer=layer, op="layer", name=name)
                        total += a.numel() * a.element_size()
    largest = max(torch.Size(s).numel() * (2 if t == "bf16" else 4) for _, s, t in NAMES)
    return {"bytes_per_arm": total, "layers": layers, "ranks": ranks, "steps": steps,
            "tensors_per_arm": layers * ranks * steps * len(NAMES), "largest_tensor_bytes": largest}


def build_small(d: Path, keys: int) -> dict:
    import torch

    from workbench.capture import CaptureWriter

    g = torch.Generator().manual_seed(1)
    with CaptureWriter(d / "control", arm="control", overwrite=True) as wc, \
            CaptureWriter(d / "candidate", arm="candidate", overwrite=True) as wd:
        for i in range(keys):
            step, rest = divmod(i, 1000)
            layer, j = divmod(rest, 10)
            a = torch.randn(64, generator=g)
            b = a if i % 3 else a + 1e-3
            t = torch.bfloat16 if j % 2 else torch.float32
            wc.add(a.to(t), step=step, layer=layer, op="l", name=f"t{j}")
            wd.add(b.to(t), step=step, layer=layer, op="l", name=f"t{j}")
    return {"keys_per_arm": keys}


def ceiling() -> dict:
    import numpy as np

    x = np.ones(1 << 27, dtype=np.float32)  # 512 MB
    y = np.zeros_like(x)
    best_copy = best_sum = 0.0
    for _ in range(3):
        t = time.perf_counter()
        np.copyto(y, x)
        best_copy = max(best_copy, x.nbytes / (time.perf_counter() - t) / 1e9)
        t = time.perf_counter()
        x.sum()
        best_sum = max(best_sum, x.nbytes / (time.perf_counter() - t) / 1e9)
    return {"numpy_copy_read_gb_s": best_copy, "numpy_copy_read_write_gb_s": 2 * best_copy,
            "numpy_sum_read_gb_s": best_sum}


def _vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(d: str, what: str) -> None:
    import numba  # noqa: F401  (imports before the memory baseline)
    import pandas  # noqa: F401
    import torch  # noqa: F401

    from workbench.analysis.compare import compare_captures, pair_metrics
    from workbench.capture import open_capture

    rss0 = _rss()
    out = {}
    t = time.perf_counter()
    r = compare_captures(Path(d) / "control", Path(d) / "candidate")
    out["cold_seconds"] = time.perf_counter() - t
    out["keys"], out["diverged"] = len(r.table), int(r.table["exceeded"].sum())
    out["first_divergence"] = r.describe_first()
    if what == "large":
        t = time.perf_counter()
        r2 = compare_captures(Path(d) / "control", Path(d) / "candidate")
        out["warm_seconds"] = time.perf_counter() - t
        assert r2.table.equals(r.table)
        # each (rank, step) partition alone: its cost and bytes, for the projection
        import numpy as np

        from workbench.analysis.distributed import partitions
        ca, cb = open_capture(Path(d) / "control"), open_capture(Path(d) / "candidate")
        pos = np.arange(len(ca))
        parts = []
        t_all = time.perf_counter()
        for p in partitions(ca.index, pos):
            t = time.perf_counter()
            pair_metrics(ca, cb, p, p)
            parts.append({"seconds": time.perf_counter() - t, "bytes": int(ca.index["nbytes"].to_numpy()[p].sum())})
        out["partitions"] = parts
        out["pair_metrics_seconds"] = time.perf_counter() - t_all
    out["peak_growth_bytes"] = _vm_hwm() - rss0
    print("__RESULT__" + json.dumps(out))


def spawn(d: Path, what: str, env: dict | None = None) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", what, "--dir", str(d)], capture_output=True,
                          text=True, check=True, env=None if env is None else {**os.environ, **env})
    line = [x for x in proc.stdout.splitlines() if x.startswith("__RESULT__")][-1]
    return json.loads(line[len("__RESULT__"):])


def on_cluster(d: Path, workers: int) -> dict:
    import pandas as pd

    from workbench.analysis.compare import compare_captures
    from workbench.analysis.distributed import connect

    t = time.perf_counter()
    client = connect(workers=workers)
    start = time.perf_counter() - t
    try:
        ctl, cand = d / "control", d / "candidate"
        t = time.perf_counter()
        first = compare_captures(ctl, cand, client=client)
        first_s = time.perf_counter() - t
        runs = []
        for _ in range(2):
            t = time.perf_counter()
            res = compare_captures(ctl, cand, client=client)
            runs.append(time.perf_counter() - t)
        local = compare_captures(ctl, cand)
        pd.testing.assert_frame_equal(res.table, local.table)
        pd.testing.assert_frame_equal(first.table, local.table)
    finally:
        cluster = client.cluster
        client.close()
        cluster.close()
    return {"workers": workers, "cluster_start_seconds": start, "first_call_seconds": first_s,
            "seconds": min(runs), "runs": runs, "equal_to_local": True}


def project(parts: list[dict], merge_s: float, task_overhead_s: float, bytes_total: int) -> dict:
    costs = sorted((p["seconds"] for p in parts), reverse=True)
    out = {}
    for n in (1, 2, 4, 8, 16, 64):
        loads = [0.0] * n
        for c in costs:  # longest processing time first
            loads[loads.index(min(loads))] += c + task_overhead_s
        t = max(loads) + merge_s
        out[str(n)] = {"seconds": t, "gb_per_s_per_arm": bytes_total / t / 1e9}
    return {"machines": out, "slowest_partition_seconds": costs[0] if costs else 0.0,
            "driver_merge_seconds": merge_s, "task_overhead_seconds": task_overhead_s,
            "floor_seconds": (costs[0] if costs else 0.0) + merge_s + task_overhead_s,
            "partitions": len(parts), "partition_bytes": [p["bytes"] for p in parts],
            "model": "LPT schedule of the measured (rank, step) partition costs on N single-worker machines of "
                     "this kind, plus the measured per-task overhead and driver merge; reading from a shared "
                     "filesystem at the page-cache speed measured here (a network filesystem is slower)"}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/wb-scale")
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--child", choices=["large", "small"])
    ap.add_argument("--keep", action="store_true")
    args = ap.parse_args()
    d = Path(args.dir)
    if args.child:
        child(args.dir, args.child)
        return
    t = time.perf_counter()
    large = build_large(d / "large", args.gb, args.ranks, args.steps)
    small = build_small(d / "small", args.keys)
    build_s = time.perf_counter() - t
    ceil = ceiling()
    # first, each comparison in a fresh process with an empty numba cache: what the very first run
    # after an install pays (JIT compilation of the kernels), reported apart; it fills the cache
    # that the measured runs below load from, as every later process does
    with tempfile.TemporaryDirectory() as jit_cache:
        lg_jit = spawn(d / "large", "large", env={"NUMBA_CACHE_DIR": jit_cache})["cold_seconds"]
        sm_jit = spawn(d / "small", "small", env={"NUMBA_CACHE_DIR": jit_cache})["cold_seconds"]
        lg = spawn(d / "large", "large", env={"NUMBA_CACHE_DIR": jit_cache})
        sm = spawn(d / "small", "small", env={"NUMBA_CACHE_DIR": jit_cache})
    cl = on_cluster(d / "large", args.workers)
    b = large["bytes_per_arm"]
    merge = max(0.0, lg["warm_seconds"] - lg["pair_metrics_seconds"])
    tasks = min(len(lg["partitions"]), 4 * args.workers)
    overhead = max(0.0, (cl["seconds"] - (lg["pair_metrics_seconds"] / args.workers) - merge) / max(1, tasks))
    budget = 2 * large["largest_tensor_bytes"] + (256 << 20)
    result = {
        "benchmark": "scale",
        "command": "python " + " ".join(sys.argv),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": _machine(),
        "versions": _versions(),
        "data": {"large": large, "small": small, "build_seconds": round(build_s, 1)},
        "ceiling": ceil,
        "local": {
            "large_cold_seconds": lg["cold_seconds"], "large_warm_seconds": lg["warm_seconds"],
            "large_cold_gb_per_s_per_arm": b / lg["cold_seconds"] / 1e9,
            "large_warm_gb_per_s_per_arm": b / lg["warm_seconds"] / 1e9,
            "large_first_divergence": lg["first_divergence"], "large_keys": lg["keys"],
            "small_keys": sm["keys"], "small_seconds_open_and_compare": sm["cold_seconds"],
            "first_run_after_install": {
                "note": "fresh process, empty numba cache: the kernels are JIT-compiled once (then cached on disk)",
                "large_seconds": lg_jit, "small_seconds": sm_jit,
                "jit_seconds_large": lg_jit - lg["cold_seconds"], "jit_seconds_small": sm_jit - sm["cold_seconds"]},
            "peak_growth_bytes": lg["peak_growth_bytes"], "memory_budget_bytes": budget,
        },
        "workers": {**cl, "gb_per_s_per_arm": b / cl["seconds"] / 1e9,
                    "speedup_vs_local_warm": lg["warm_seconds"] / cl["seconds"]},
        "projection": project(lg["partitions"], merge, overhead, b),
        "targets": {
            "large_warm>=1GB/s/arm": b / lg["warm_seconds"] / 1e9 >= 1.0,
            "small_100k<10s": sm["cold_seconds"] < 10.0,
            "peak_growth<=2*largest+256MB": lg["peak_growth_bytes"] <= budget,
        },
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    f = out / f"scale-{dt.date.today().isoformat()}.json"
    f.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("ceiling", "local", "workers", "targets")}, indent=1))
    print(json.dumps({k: v for k, v in result["projection"].items() if k != "partition_bytes"}, indent=1))
    print(f"wrote {f}")
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)


def _machine() -> dict:
    from workbench.numerics.portable import cpu_name

    return {"cpu": cpu_name(), "cores": os.cpu_count(), "platform": platform.platform(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)}


def _versions() -> dict:
    import dask
    import distributed
    import numba
    import numpy
    import pandas
    import torch

    import workbench
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "numba": numba.__version__, "pandas": pandas.__version__, "dask": dask.__version__,
            "distributed": distributed.__version__, "workbench": workbench.__version__}


if __name__ == "__main__":
    main()
