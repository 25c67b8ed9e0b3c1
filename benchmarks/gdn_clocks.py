"""Where a chunk's cycles go inside the GDN mma kernels: a diagnostic build of gdn_mma.cu with
phase clocks (``-DWB_GDN_CLOCKS``; lane 0 of each warp of every 16th block adds the cycles since
its previous mark to a per-(kernel, warp, phase) counter with fire-and-forget atomics), run on the
prefill shapes of gdn_matrix.py with each pass forced, printed as cycles a chunk (prepare: a
value head) per phase, averaged over the warps and iterations marked.

    python benchmarks/gdn_clocks.py --only "B1 T8192" "K64" --passes smem smem16 warp \
        --out benchmarks/results/gdn-clocks-h100-YYYY-MM-DD.json

The marks are issue times: a phase that only issues mma ends before they complete, and their
latency lands in the phase that first reads the results (the pass's "S to smem" holds the state
update's, the warp pass's "K S, Q S, R" the previous chunk's update). The clocked build is a little
slower than the plain one (the atomics), so the phases' shares are what to read, not the sums.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdn import _fla, _versions  # noqa: E402
from gdn_matrix import PREFILL, prefill_calls  # noqa: E402

from workbench.kernels import _native  # noqa: E402
from workbench.kernels.gdn import ext  # noqa: E402

# the marks of each kernel (kernels/gdn/gdn_mma.cu, WB_CLK(p)): the phase each one closes
PHASES = {
    "prepare": {0: "load K, Q (once a block)", 1: "issue K K^T, Q K^T (once a block)",
                2: "gc scan (warp 0)", 3: "barrier a", 4: "A epilogue (products' latency)",
                5: "barrier b", 6: "inverse + substitution (w0-1) / P (w2-7)", 7: "barrier c",
                8: "PT = P Tinv", 9: "factor rows", 10: "barrier d"},
    "smem": {0: "state load, first copies (once)", 1: "S to smem (update's latency)",
             2: "wait copies + barrier 1", 3: "issue next copies", 4: "K S, Q S, R epilogue",
             5: "barrier 2", 6: "issue queries", 7: "U, PT R, o, Ud", 8: "barrier 3",
             9: "issue update"},
    "warp": {0: "state load, first copies (once)", 1: "wait copies + barrier",
             2: "issue next copies", 3: "K S, Q S, R (previous update's latency)",
             4: "R PT^T, o stores", 5: "U = R Tinv^T, decay", 6: "issue update"},
}
KERNEL = {"prepare": 0, "smem": 1, "smem16": 1, "warp": 2}


def clocked_library():
    """ext's CUDA library built with the phase clocks (its own cache entry)."""
    plain = _native.load
    ext.library.cache_clear()
    _native.load = lambda *a, **k: plain(*a, **{**k, "flags": [*(k.get("flags") or []),
                                                               "-DWB_GDN_CLOCKS"]})
    try:
        lib = ext.library("cuda")
    finally:
        _native.load = plain
    lib.gdn_mma_clocks.argtypes, lib.gdn_mma_clocks.restype = [ctypes.c_void_p], ctypes.c_int
    return lib


def read(lib) -> torch.Tensor:
    buf = (ctypes.c_ulonglong * (3 * 8 * 16))()
    err = lib.gdn_mma_clocks(ctypes.addressof(buf))
    if err:
        raise RuntimeError(f"gdn_mma_clocks: CUDA error {err}")
    return torch.tensor(list(buf), dtype=torch.float64).view(3, 8, 16)


def summary(c: torch.Tensor, kernel: str) -> dict:
    """Cycles an iteration per phase, over the warps that marked (prepare: warps 0-1 and 2-7 apart,
    their roles differ)."""
    k = c[KERNEL[kernel]]
    names = PHASES["smem" if kernel == "smem16" else kernel]
    groups = {"w0-1": [0, 1], "w2-7": list(range(2, 8))} if kernel == "prepare" else \
        {"w0-3": [0, 1, 2, 3], "w4-7": [4, 5, 6, 7]}
    out = {}
    for g, ws in groups.items():
        rows = k[ws]
        it = float(rows[:, 15].sum())
        if it == 0:
            continue
        per = {names[p]: round(float(rows[:, p].sum()) / it, 1) for p in names}
        total = sum(v for p, v in per.items() if "once" not in p)
        out[g] = {"iterations": int(it), "cycles_per_iteration": round(total, 1), "phases": per}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="*", default=None, help="shapes whose name contains one of these")
    ap.add_argument("--passes", nargs="+", default=["smem", "smem16", "warp"])
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    lib = clocked_library()
    try:  # fla is only the peer of gdn_matrix's shapes; the clocks time ours alone
        chunk, _ = _fla()
    except ImportError:
        chunk = None
    rows = []
    for name, B, T, H, HV, K, V, norm in PREFILL:
        if args.only and not any(o in name for o in args.only):
            continue
        ours, _, _, _, _ = prefill_calls(chunk, B, T, H, HV, K, V, norm)
        for p in args.passes:
            os.environ["WORKBENCH_GDN_MMA_PASS"] = p
            ours()
            torch.cuda.synchronize()
            read(lib)  # zero the counters after the warm-up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(args.reps):
                ours()
            end.record()
            torch.cuda.synchronize()
            c = read(lib)
            row = {"shape": name, "pass": p, "ms_per_call_clocked": start.elapsed_time(end) / args.reps,
                   "prepare": summary(c, "prepare"), "pass_phases": summary(c, p)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        os.environ.pop("WORKBENCH_GDN_MMA_PASS", None)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({
            "command": "python benchmarks/gdn_clocks.py " + " ".join(sys.argv[1:]),
            "device": torch.cuda.get_device_name(), "versions": _versions(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "note": "cycles an iteration (a chunk; prepare: a value head) per phase, from a build "
                    "with -DWB_GDN_CLOCKS; issue-time marks (see the script's docstring)",
            "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
