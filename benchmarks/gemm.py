"""Split-K matmul vs torch.matmul at the lm_head shape on the H200.

    python benchmarks/gemm.py --out benchmarks/results/gemm-h200.json

x [M, 4096] bf16 with M = 1..16, w [151936, 4096] bf16 (nn.Linear layout). Each split-K variant
is checked against the fp64 oracle (partial rounding emulated) on a subset of columns before it is
timed; the peer is torch.matmul(x, w.T) in bf16 in the same process. Bandwidth counts the bytes of
w read once (1.245 GB), the floor for every variant.

Variants: ``ext_S{S}_{part}`` is the ext CUDA backend on its automatic path (tensor cores for bf16
inputs), ``ext-scalar_S{S}_fp32`` the same backend forced onto its CUDA-core kernel
(WORKBENCH_GEMM_CUDA_PATH=scalar, the kernel of the earlier results), ``numba_S{S}_fp32`` the numba
backend (only with --numba).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from qsa import bench_ms, copy_bandwidth_gbs, write  # noqa: E402

from workbench.kernels.gemm import ext, numba_cuda, oracle  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/gemm-h200.json")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--splits", default="1,4,9,16")
    ap.add_argument("--scalar-splits", default="1,4", help="splits timed on the CUDA-core path too")
    ap.add_argument("--numba", action="store_true", help="time the numba backend too (fp32 partials)")
    a = ap.parse_args(argv)
    scalar_splits = {int(v) for v in a.scalar_splits.split(",") if v}
    N, K = 151936, 4096
    ceiling = copy_bandwidth_gbs()
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(N, K, device="cuda", generator=g) / 64).bfloat16()
    xs = torch.randn(16, K, device="cuda", generator=g).bfloat16()
    cols = torch.arange(0, N, 97, device="cuda")
    wsub = w[cols].cpu()
    nbytes = N * K * 2
    rows = []
    for M in map(int, a.batches.split(",")):
        x = xs[:M].contiguous()
        res = {"M": M, "N": N, "K": K, "w_bytes": nbytes}
        peer_ms = bench_ms(lambda: torch.matmul(x, w.T))
        res["torch_matmul_bf16"] = {"ms": peer_ms, "GBps": nbytes / peer_ms / 1e6}
        for S in map(int, a.splits.split(",")):
            for part in ("fp32", "bf16"):
                ref = oracle.splitk_matmul(x.cpu(), wsub, splits=S, partial_dtype=part)
                variants = [("ext", ext, "auto")]
                if part == "fp32" and S in scalar_splits:
                    variants.append(("ext-scalar", ext, "scalar"))
                if part == "fp32" and a.numba:
                    variants.append(("numba", numba_cuda, None))
                for name, mod, path in variants:
                    key = f"{name}_S{S}_{part}"
                    if path is not None:
                        os.environ[ext.PATH_ENV] = path
                    fn = (lambda m=mod, s=S, p=part: m.splitk_matmul(x, w, splits=s, partial_dtype=p, order="sequential",
                                                                    out_dtype="bf16", policy=None))
                    try:
                        y = mod.splitk_matmul(x, w, splits=S, partial_dtype=part, order="sequential", out_dtype="fp32",
                                              policy=None)
                        err = float((y[:, cols].double().cpu() - ref).norm() / ref.norm())
                        if err > (1e-6 if part == "fp32" else 1e-3):
                            res[key] = {"error": f"rel_l2 vs oracle {err:.3e}"}
                            continue
                        ms = bench_ms(fn)
                        res[key] = {"ms": ms, "GBps": nbytes / ms / 1e6, "ratio_vs_torch": ms / peer_ms,
                                    "rel_l2_vs_oracle": err}
                        if path is not None:
                            res[key]["cuda_path"] = ext.cuda_path(x.dtype)
                    except Exception as e:
                        res[key] = {"error": f"{type(e).__name__}: {e}"[:400]}
                    finally:
                        os.environ.pop(ext.PATH_ENV, None)
        fp32 = [(v["ratio_vs_torch"], k) for k, v in res.items() if k.endswith("_fp32") and "ms" in v]
        res["best_fp32_partials"] = {"name": min(fp32)[1], "ratio_vs_torch": min(fp32)[0]} if fp32 else None
        print(f"M={M:2d} torch {peer_ms:.3f} ms | " + " | ".join(
            f"{k} {v['ms']:.3f} ({v['ratio_vs_torch']:.2f}x)" for k, v in res.items() if isinstance(v, dict) and "ratio_vs_torch" in v and "ms" in v),
            flush=True)
        rows.append(res)
    met = all(r["best_fp32_partials"] and r["best_fp32_partials"]["ratio_vs_torch"] <= 1.5 for r in rows)
    write(a.out, "python " + " ".join(shlex.quote(x) for x in ["benchmarks/gemm.py", *(argv or sys.argv[1:])]), rows,
          copy_bandwidth_GBps=ceiling, target="split-K (fp32 partials) within 1.5x of torch.matmul", target_met=met)


if __name__ == "__main__":
    main()
