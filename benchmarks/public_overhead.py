"""What the public kernel API costs over calling the backend function directly, side by side.

For GDN decode (``gdn.recurrent``, T=1) and QSA sparse decode (``qsa.sparse_decode``) on the
``ext`` and ``numba`` backends: the time per call of back-to-back eager calls (no synchronization
between them, so Python and launch cost show) through the public function and through the backend
module's function with a resolved Policy, in the same run, alternating, median of ``--reps``
rounds; and both captured in a CUDA graph (replay time: no Python at all). ``ratio`` is direct
time / public time (1.0: no overhead; the target is >= 0.9).

Usage::

    python benchmarks/public_overhead.py [--device cuda] [--iters 200] [--reps 7] [--out DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from gdn import _graphed as capture_graph  # noqa: E402  (the CUDA-graph capture of benchmarks/gdn.py)

from workbench.kernels import gdn, qsa  # noqa: E402
from workbench.kernels.qsa.problems import decode_problem  # noqa: E402
from workbench.numerics.policy import Policy  # noqa: E402


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def _per_call(fn, iters, dev) -> float:
    _sync(dev)
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(dev)
    return (time.perf_counter() - t) / iters


def _graphed(fn, iters) -> float:
    """Time per replay of ``fn`` captured in a CUDA graph (benchmarks/gdn.py's capture)."""
    return _per_call(capture_graph(fn), iters, torch.device("cuda"))


def cases(dev):
    pol = Policy()
    for B in (1, 64):
        gen = torch.Generator().manual_seed(B)
        H, HV, K, V = 16, 32, 128, 128
        q = torch.randn(B, 1, H, K, generator=gen).to(dev)
        k = torch.randn(B, 1, H, K, generator=gen).to(dev)
        v = torch.randn(B, 1, HV, V, generator=gen).to(dev)
        g = (-0.1 * torch.rand(B, 1, HV, generator=gen)).to(dev)
        beta = torch.rand(B, 1, HV, generator=gen).to(dev)
        s0 = (0.1 * torch.randn(B, HV, K, V, generator=gen)).to(dev)
        for be in ("ext", "numba"):
            mod = importlib.import_module(f"workbench.kernels.gdn.{'numba_cuda' if be == 'numba' else be}")
            yield (f"gdn.recurrent B{B} H{H} HV{HV} K{K} V{V}", be,
                   lambda be=be: gdn.recurrent(q, k, v, g, beta, initial_state=s0, qk_l2norm=True, backend=be),
                   lambda mod=mod: mod.recurrent(q, k, v, g, beta, initial_state=s0, qk_l2norm=True, policy=pol))
    for B in (1, 32):
        pb = decode_problem(B=B, HQ=16, HKV=2, D=128, seqlen=4096, budget=1024, seed=B).to(dev)
        p4 = Policy(num_kv_splits=4)
        for be in ("ext", "numba"):
            mod = importlib.import_module(f"workbench.kernels.qsa.{'numba_cuda' if be == 'numba' else be}")
            yield (f"qsa.sparse_decode B{B} HQ16 HKV2 D128 L1024", be,
                   lambda be=be, pb=pb: qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, policy=p4,
                                                          backend=be),
                   lambda mod=mod, pb=pb: mod.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, policy=p4))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    dev = torch.device(args.device)
    rows = []
    for name, be, public, direct in cases(dev):
        try:
            public(); direct()  # JIT / build before timing
        except Exception as e:  # a backend that cannot run here: said in the result
            rows.append({"case": name, "backend": be, "skipped": f"{type(e).__name__}: {e}"})
            continue
        pub, dire = [], []
        for _ in range(args.reps):  # alternate, so drift hits both alike
            pub.append(_per_call(public, args.iters, dev))
            dire.append(_per_call(direct, args.iters, dev))
        row = {"case": name, "backend": be, "eager_public_us": statistics.median(pub) * 1e6,
               "eager_direct_us": statistics.median(dire) * 1e6}
        row["eager_ratio_direct_over_public"] = row["eager_direct_us"] / row["eager_public_us"]
        if dev.type == "cuda":
            row["graphed_public_us"] = _graphed(public, args.iters) * 1e6
            row["graphed_direct_us"] = _graphed(direct, args.iters) * 1e6
            row["graphed_ratio_direct_over_public"] = row["graphed_direct_us"] / row["graphed_public_us"]
        rows.append(row)
        print(json.dumps(row))
    ran = [r for r in rows if "skipped" not in r]
    result = {
        "benchmark": "public_overhead", "command": "python " + " ".join(sys.argv),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu",
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "cuda": torch.version.cuda},
        "rows": rows,
        "summary": {"min_eager_ratio": min((r["eager_ratio_direct_over_public"] for r in ran), default=None),
                    "min_graphed_ratio": min((r.get("graphed_ratio_direct_over_public", 1.0) for r in ran), default=None),
                    "target": "direct / public >= 0.9"},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    f = out / f"public-overhead-{dev.type}-{dt.date.today().isoformat()}.json"
    f.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"]))
    print(f"wrote {f}")


if __name__ == "__main__":
    main()
