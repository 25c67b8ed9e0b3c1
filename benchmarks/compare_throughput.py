"""Throughput of compare_captures against the usual way of comparing dumps.

Builds a control and a candidate capture of about 2 GB each (bf16 activations, fp32 projections,
GDN states and logits of realistic sizes), plus the same tensors as one ``.pt`` file per tensor,
then times in separate processes (so each has its own peak RSS), alternating:

- ours: ``workbench.compare_captures(control, candidate)`` (memory-mapped, fused float64 pass);
- baseline: for each key ``torch.load`` both ``.pt`` files and compute the same metrics with torch
  ops in float64 (rel L2, max abs and where, mean abs, cosine, SQNR, ULP distance, fraction
  outside atol + rtol|a|, NaN/Inf counts), the way such dumps are compared by hand today.

Both read from the page cache (the files were just written); ours runs once first to fill numba's
on-disk cache. Usage::

    python benchmarks/compare_throughput.py --dir /tmp/wb-bench [--gb 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def layer_tensors(layer: int) -> list[tuple[str, tuple, torch.dtype]]:
    return [
        ("hidden", (4096, 4096), torch.bfloat16),        # residual stream, 4096 tokens
        ("mlp_act", (4096, 12288), torch.bfloat16),      # MLP intermediate
        ("qkv", (4096, 2048), torch.float32),            # a projection output kept in fp32
        ("state", (32, 128, 128), torch.float32),        # GDN recurrent state
    ]


def build(dirpath: Path, gb: float) -> dict:
    from workbench.capture import CaptureWriter

    g = torch.Generator().manual_seed(0)
    per_layer = sum(torch.Size(s).numel() * torch.empty((), dtype=d).element_size() for _, s, d in layer_tensors(0))
    layers = max(1, int(gb * 1e9 // per_layer))
    shutil.rmtree(dirpath, ignore_errors=True)
    for arm in ("control", "candidate"):
        (dirpath / "pt" / arm).mkdir(parents=True)
    total = 0
    with CaptureWriter(dirpath / "control", arm="control") as wc, \
            CaptureWriter(dirpath / "candidate", arm="candidate") as wd:
        for layer in range(layers):
            for name, shape, dtype in layer_tensors(layer):
                a = torch.randn(shape, generator=g)
                b = a + 1e-3 * torch.randn(shape, generator=g) if layer % 2 else a.clone()
                a, b = a.to(dtype), b.to(dtype)
                wc.add(a, layer=layer, op="layer", name=name)
                wd.add(b, layer=layer, op="layer", name=name)
                torch.save(a, dirpath / "pt" / "control" / f"layer{layer}.{name}.pt")
                torch.save(b, dirpath / "pt" / "candidate" / f"layer{layer}.{name}.pt")
                total += a.numel() * a.element_size()
    return {"layers": layers, "bytes_per_arm": total}


def _ordered(t: torch.Tensor) -> torch.Tensor:
    it = {torch.float32: torch.int32, torch.float64: torch.int64, torch.bfloat16: torch.int16,
          torch.float16: torch.int16}[t.dtype]
    bits = t.view(it).to(torch.int64)
    nbits = t.element_size() * 8
    if nbits == 16:
        bits = bits & 0xFFFF
    sign = 1 << (nbits - 1)
    mag = bits & (sign - 1)
    return torch.where((bits & sign) != 0, -mag, mag)


def baseline_metrics(a: torch.Tensor, b: torch.Tensor, atol=1e-5, rtol=1e-3) -> dict:
    x, y = a.double(), b.double()
    fin = torch.isfinite(x) & torch.isfinite(y)
    d = torch.where(fin, (y - x).abs(), torch.zeros_like(x))
    xf, yf = torch.where(fin, x, 0.0), torch.where(fin, y, 0.0)
    sa2, sb2, sab, sd2 = (xf * xf).sum(), (yf * yf).sum(), (xf * yf).sum(), (d * d).sum()
    u = (_ordered(a) - _ordered(b)).abs()[fin]
    idx = int(d.argmax())
    return dict(
        rel_l2=float((sd2 / sa2).sqrt()), max_abs=float(d.max()), where=idx,
        mean_abs=float(d.sum() / fin.sum()), cosine=float(sab / (sa2 * sb2).sqrt()),
        sqnr=float(10 * torch.log10(sa2 / sd2)) if sd2 > 0 else float("inf"),
        max_ulp=int(u.max()), median_ulp=float(u.median()),
        frac_outside=float(((y - x).abs() > atol + rtol * x.abs()).double().mean()),
        nan=(int(x.isnan().sum()), int(y.isnan().sum())), inf=(int(x.isinf().sum()), int(y.isinf().sum())),
    )


def run_ours(dirpath: Path) -> dict:
    from workbench.analysis.compare import compare_captures

    t0 = time.perf_counter()
    r = compare_captures(dirpath / "control", dirpath / "candidate")
    el = time.perf_counter() - t0
    return {"seconds": el, "keys": len(r.table), "diverged": int(r.table["exceeded"].sum())}


def run_baseline(dirpath: Path) -> dict:
    t0 = time.perf_counter()
    files = sorted((dirpath / "pt" / "control").glob("*.pt"))
    diverged = 0
    for f in files:
        a = torch.load(f, weights_only=True)
        b = torch.load(dirpath / "pt" / "candidate" / f.name, weights_only=True)
        m = baseline_metrics(a, b)
        diverged += m["rel_l2"] > 1e-3
        del a, b
    return {"seconds": time.perf_counter() - t0, "keys": len(files), "diverged": int(diverged)}


def _vm_hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(which: str, dirpath: str) -> None:
    torch.set_num_threads(os.cpu_count() or 1)
    import numba  # noqa: F401  (both methods pay the same imports before the baseline RSS)
    import pandas  # noqa: F401
    import xarray  # noqa: F401

    import workbench.analysis.compare  # noqa: F401
    rss0 = _rss()
    res = (run_ours if which == "ours" else run_baseline)(Path(dirpath))
    # VmHWM belongs to this process image; getrusage's ru_maxrss survives execve and would report
    # the parent's footprint (the parent just built gigabytes of tensors) instead.
    res["peak_rss_bytes"] = _vm_hwm()
    res["rss_after_imports_bytes"] = rss0
    res["peak_growth_bytes"] = res["peak_rss_bytes"] - rss0
    print("__RESULT__" + json.dumps(res))


def spawn(which: str, dirpath: Path) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", which, "--dir", str(dirpath)],
                          capture_output=True, text=True, check=True)
    line = [l for l in proc.stdout.splitlines() if l.startswith("__RESULT__")][-1]
    return json.loads(line[len("__RESULT__"):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default="/tmp/wb-bench")
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--child", choices=["ours", "baseline"])
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    args = ap.parse_args()
    d = Path(args.dir)
    if args.child:
        child(args.child, args.dir)
        return
    t0 = time.perf_counter()
    info = build(d, args.gb)
    build_s = time.perf_counter() - t0
    largest = max(torch.Size(s).numel() * torch.empty((), dtype=dt_).element_size() for _, s, dt_ in layer_tensors(0))
    spawn("ours", d)  # warm numba's on-disk cache (the files are in the page cache since build)
    runs = {"ours": [], "baseline": []}
    for _ in range(args.repeats):
        for which in ("ours", "baseline"):
            runs[which].append(spawn(which, d))
    med = {k: sorted(r["seconds"] for r in v)[len(v) // 2] for k, v in runs.items()}
    gbps = {k: info["bytes_per_arm"] / v / 1e9 for k, v in med.items()}
    peak = {k: max(r["peak_rss_bytes"] for r in v) for k, v in runs.items()}
    growth = {k: max(r["peak_growth_bytes"] for r in v) for k, v in runs.items()}
    result = {
        "benchmark": "compare_throughput",
        "command": "python " + " ".join(sys.argv),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": _cpu(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)},
        "versions": _versions(),
        "data": {**info, "tensors_per_arm": info["layers"] * len(layer_tensors(0)),
                 "largest_tensor_bytes": largest, "build_seconds": round(build_s, 1)},
        "runs": runs,
        "median_seconds": med,
        "gb_per_s_per_arm": gbps,
        "speedup_vs_baseline": med["baseline"] / med["ours"],
        "peak_rss_bytes": peak,
        "peak_growth_above_imports_bytes": growth,
        "memory_budget_bytes": 2 * largest + (256 << 20),
        "memory_note": "peak_growth is the peak RSS minus the RSS after importing torch, numba, pandas, "
                       "xarray and workbench (about 370 MB on its own), i.e. the memory the comparison uses",
        "targets": {"gb_per_s_per_arm>=1": gbps["ours"] >= 1.0,
                    "speedup>=3": med["baseline"] / med["ours"] >= 3.0,
                    "peak_growth<=2*largest+256MB": growth["ours"] <= 2 * largest + (256 << 20)},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    f = out / f"compare_throughput-{dt.date.today().isoformat()}.json"
    f.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("median_seconds", "gb_per_s_per_arm", "speedup_vs_baseline",
                                             "peak_rss_bytes", "peak_growth_above_imports_bytes",
                                             "memory_budget_bytes", "targets")}, indent=1))
    print(f"wrote {f}")
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)


def _cpu() -> str:
    from workbench.numerics.portable import cpu_name

    return cpu_name()


def _versions() -> dict:
    import numba
    import numpy
    import pandas

    import workbench
    return {"python": platform.python_version(), "torch": torch.__version__, "numpy": numpy.__version__,
            "numba": numba.__version__, "pandas": pandas.__version__, "workbench": workbench.__version__}


if __name__ == "__main__":
    main()
