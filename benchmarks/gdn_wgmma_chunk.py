"""What the products of one chunk step of a fused GDN prefill kernel cost on wgmma, tf32 against
bf16 operands, before such a kernel is written (kernels/gdn/gdn_wgmma_chunk.cu: a block of two
warpgroups holding a 128 x 128 state in wgmma accumulators, the chunk's five products with
register A operands, FlashInfer's fused kernel's shape; no loads, no solve, no gates but one
decay). Checks the products against float64 first (a few chunks), then times `chunks` steps on
`blocks` blocks (one an SM where blocks <= SMs: a chunk step's wall time is time / chunks), the
two kinds interleaved, several rounds, the lower median of each.

    python benchmarks/gdn_wgmma_chunk.py --out benchmarks/results/gdn-wgmma-chunk-h100-DATE.json
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import platform
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.kernels import _native  # noqa: E402

KINDS = {"tf32": 0, "bf16": 1, "bf16x2": 2}
C, K, V = 64, 128, 128


def load():
    lib = _native.load("gdn_wgmma_chunk", ["gdn/gdn_wgmma_chunk.cu"], kind="cuda", headers=["common/mma_ops.h", "common/wgmma_tiles.h"])
    lib.wgmma_chunk_run.restype = ctypes.c_int
    lib.wgmma_chunk_run.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 6 + [
        ctypes.c_float, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return lib


def operands(seed=0):
    """The B tiles (math orientation, contraction first) and the initial state, float32. Those
    that stand for q and k (Bq, Bk, Bk2) and the state are exact in bf16, as a GDN kernel's bf16
    inputs are; Bt and Bp (the chunk's T and P, float32 in a GDN kernel) are not (so the bf16
    kind rounds them, the tf32 kind truncates them, bf16x2 splits them)."""
    rng = np.random.default_rng(seed)

    def m(*shape, scale, exact=True):
        x = (rng.standard_normal(shape) * scale).astype(np.float32)
        return (x.view(np.uint32) & 0xFFFF0000).view(np.float32) if exact else x
    return {"Bq": m(K, C, scale=K ** -0.5), "Bk": m(K, C, scale=K ** -0.5),
            "Bt": m(C, C, scale=0.5 * C ** -0.5, exact=False), "Bp": m(C, C, scale=0.5 * C ** -0.5, exact=False),
            "Bk2": m(C, K, scale=0.5 * C ** -0.5), "S0": m(V, K, scale=1.0)}


def reference(ops, decay, chunks):
    """The chain in float64: o = S Bq; x = -(S Bk); nv = x Bt; o += nv Bp; S = decay S + nv Bk2."""
    S = ops["S0"].astype(np.float64)
    o = None
    for _ in range(chunks):
        o = S @ ops["Bq"]
        x = -(S @ ops["Bk"])
        nv = x @ ops["Bt"]
        o = o + nv @ ops["Bp"]
        S = decay * S + nv @ ops["Bk2"]
    return S, o


def run(lib, kind, ops_dev, decay, chunks, blocks, S_out, o_out):
    import torch
    st = lib.wgmma_chunk_run(KINDS[kind], blocks, *[ops_dev[n].data_ptr() for n in ("Bq", "Bk", "Bt", "Bp", "Bk2", "S0")],
                             decay, chunks, S_out.data_ptr(), o_out.data_ptr(), torch.cuda.current_stream().cuda_stream)
    if st != 0:
        raise RuntimeError(f"wgmma_chunk_run({kind}): CUDA status {st}")


def check(lib, ops, ops_dev, decay=0.5, chunks=3):
    """rel L2 of S and o against float64, each kind."""
    import torch
    rs, ro = reference(ops, decay, chunks)
    out = {}
    for kind in KINDS:
        S = torch.full((V, K), float("nan"), device="cuda")
        o = torch.full((V, C), float("nan"), device="cuda")
        run(lib, kind, ops_dev, decay, chunks, 1, S, o)
        torch.cuda.synchronize()
        s, oo = S.cpu().double().numpy(), o.cpu().double().numpy()
        out[kind] = {"rel_l2_S": float(np.linalg.norm(s - rs) / np.linalg.norm(rs)),
                     "rel_l2_o": float(np.linalg.norm(oo - ro) / np.linalg.norm(ro))}
    return out


def time_ms(lib, kind, ops_dev, chunks, blocks, S, o, reps=20):
    import torch
    run(lib, kind, ops_dev, 0.5, chunks, blocks, S, o)  # warm
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for a, b in ev:
        a.record()
        run(lib, kind, ops_dev, 0.5, chunks, blocks, S, o)
        b.record()
    torch.cuda.synchronize()
    return float(np.median([a.elapsed_time(b) for a, b in ev]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--chunks", type=int, nargs="*", default=[64, 256])
    ap.add_argument("--blocks", type=int, nargs="*", default=None, help="default: the SM count and 128")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    import torch
    lib = load()
    ops = operands()
    ops_dev = {n: torch.from_numpy(a).cuda() for n, a in ops.items()}
    acc = check(lib, ops, ops_dev)
    print(json.dumps({"check": acc}))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    S = torch.empty(V, K, device="cuda")
    o = torch.empty(V, C, device="cuda")
    rows = []
    for blocks in args.blocks or [sms, 128]:
        for chunks in args.chunks:
            runs = {k: [] for k in KINDS}
            for _ in range(args.rounds):
                for kind in KINDS:
                    runs[kind].append(time_ms(lib, kind, ops_dev, chunks, blocks, S, o))
            ms = {k: min(v) for k, v in runs.items()}
            row = {"blocks": blocks, "chunks": chunks, **{f"ms_{k}": ms[k] for k in KINDS},
                   **{f"us_per_chunk_{k}": 1e3 * ms[k] / chunks for k in KINDS},
                   **{f"ms_{k}_runs": runs[k] for k in KINDS}, "tf32_over_bf16": ms["tf32"] / ms["bf16"],
                   "bf16x2_over_tf32": ms["bf16x2"] / ms["tf32"]}
            # the products' FLOPs a chunk step and block: 2 warpgroups x (2 x 64x64x128 + 2 x 64x64x64
            # + 64x128x64) x 2 (bf16x2: the same useful FLOPs, its extra half-products not counted)
            flops = 2 * 2 * (2 * 64 * 64 * 128 + 2 * 64 * 64 * 64 + 64 * 128 * 64) * chunks * blocks
            row.update({f"tflops_{k}": flops / (ms[k] * 1e-3) / 1e12 for k in KINDS})
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if not k.endswith("_runs")}))
    out = {"command": "python " + " ".join(sys.argv), "device": torch.cuda.get_device_name(), "sms": sms,
           "versions": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda},
           "date": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
           "what": "the five wgmma products of a fused GDN chunk step (two warpgroups, state 128 x 128 in "
                   "accumulators, C = 64), no loads / solve / gates: kernels/gdn/gdn_wgmma_chunk.cu",
           "check_vs_float64": acc, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
