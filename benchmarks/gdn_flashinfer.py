"""GDN chunked prefill: ours against FlashInfer's (SM90: its CuTe DSL kernel) and fla's, side by
side in one process, over gdn_matrix.py's prefill shapes. GPU only; FlashInfer comes from the
folder ``benchmarks/flashinfer_carry.py``'s two archives were unpacked into (``--site``).

    python benchmarks/gdn_flashinfer.py --site /tmp/fi --out benchmarks/results/gdn-flashinfer-h100-YYYY-MM-DD.json

FlashInfer's ``chunk_gated_delta_rule`` takes packed ``[tokens, heads, dim]`` inputs and
``cu_seqlens`` (a batch of B is passed as B packed sequences of T), gates in the log domain here
(``gate_domain="log"``, ours and fla's convention), float32 beta and states. Times are CUDA-graph
replays where FlashInfer's call can be captured, else eager calls (the row says which); o is
compared with ours (rel L2), and the final state (FlashInfer's states are [N, HV, V, K], ours
[N, HV, K, V]: the initial state goes in transposed, the final one is compared transposed back).
"""

from __future__ import annotations

import argparse
import datetime
import json
import site
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdn import _bench, _fla, _graphed, _versions  # noqa: E402
from gdn_matrix import PREFILL, _rel, per_kernel, prefill_calls  # noqa: E402

from workbench.kernels.gdn import oracle  # noqa: E402
from workbench.kernels.gdn.flashinfer import call_arguments  # noqa: E402


def fp64_errors(x: dict, norm: bool, outs: dict) -> dict:
    """rel L2 of each side's o and final state against the FP64 oracle on the same inputs (the
    chunked float64 form on the GPU, a packed batch per sequence); outs: {side: (o, state)} in
    our layouts ([B, T, HV, V], [N, HV, K, V])."""
    cu = x["cu_seqlens"]
    ref_o, ref_s = oracle.chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                  qk_l2norm=norm, cu_seqlens=None if cu is None else cu.tolist())
    got = {}
    for side, (o, st) in outs.items():
        got[f"rel_l2_o_{side}_vs_fp64"] = _rel(ref_o, o.reshape(ref_o.shape))
        got[f"rel_l2_state_{side}_vs_fp64"] = _rel(ref_s, st.reshape(ref_s.shape))
    return got


def summarize(rows: list[dict]) -> dict:
    """The minimum and maximum ratios over the shapes, and the shapes FlashInfer refused."""
    both = [r for r in rows if "flashinfer_over_ours" in r]
    return {"min_fla_over_ours": min(r["fla_over_ours"] for r in rows),
            "min_fla_over_flashinfer": min((r["fla_over_flashinfer"] for r in both), default=None),
            "min_flashinfer_over_ours": min((r["flashinfer_over_ours"] for r in both), default=None),
            "max_flashinfer_over_ours": max((r["flashinfer_over_ours"] for r in both), default=None),
            "flashinfer_refused": [r["shape"] for r in rows if r not in both]}


def flashinfer_call(fi, x: dict, norm: bool):
    """FlashInfer's call on the same inputs: the batch as B packed sequences (or the given ones),
    its arguments formed once by the backend's ``call_arguments`` (kept for the graph)."""
    q = x["q"]
    B, T = q.shape[0], q.shape[1]
    cu = x["cu_seqlens"]
    offsets = list(range(0, B * T + 1, T)) if cu is None else cu.tolist()
    args, kwargs, out_state = call_arguments(q, x["k"], x["v"], x["g"], x["beta"], scale=q.shape[-1] ** -0.5,
                                             offsets=offsets, initial_state=x["initial_state"], qk_l2norm=norm)

    def call():
        return fi.chunk_gated_delta_rule(*args, **kwargs)
    return call, out_state


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", type=Path, required=True, help="the folder the two archives were unpacked into")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", nargs="*", default=None, help="shapes whose name contains one of these")
    ap.add_argument("--accuracy", action="store_true", help="each side's o and state against the FP64 oracle")
    ap.add_argument("--kernels", action="store_true",
                    help="each side's GPU time per kernel (torch.profiler, eager calls)")
    args = ap.parse_args()
    site.addsitedir(str(args.site))  # the DSL's .pth puts its packages on the path
    import flashinfer
    import flashinfer.gdn_prefill as fi
    chunk, _ = _fla()
    rows, errors = [], []
    for name, B, T, H, HV, K, V, norm in PREFILL:
        if args.only and not any(o in name for o in args.only):
            continue
        try:
            x: dict = {}
            ours, peer, lengths, total, _ = prefill_calls(chunk, B, T, H, HV, K, V, norm, keep=x)
            o1, s1 = ours()
            o2, s2 = peer()
            call, fs = flashinfer_call(fi, x, norm)
            try:  # a shape FlashInfer refuses (e.g. K = V = 64 on SM90) still times ours and fla
                fo = call()
                fo = fo[0] if isinstance(fo, tuple) else fo
                refused = None
            except Exception as e:
                fo, refused = None, f"{type(e).__name__}: {str(e)[:300]}"
            torch.cuda.synchronize()
            graphs = {"ours": _graphed(ours), "fla": _graphed(peer)}
            fi_timing = f"refused ({refused})" if refused else "graphed"
            if not refused:
                try:
                    graphs["flashinfer"] = _graphed(call)
                except Exception as e:  # a call that cannot be captured is timed eagerly
                    graphs["flashinfer"] = call
                    fi_timing = f"eager ({type(e).__name__}: {str(e)[:200]})"
            runs = {n: [] for n in graphs}
            for _ in range(2):
                for n, g in graphs.items():
                    runs[n].append(_bench(g))
            ms = {n: min(r) for n, r in runs.items()}
            row = {"shape": name, "B": B, "T": total, "H": H, "HV": HV, "K": K, "V": V,
                   "varlen": bool(lengths), "norm_in_kernel": norm, "flashinfer_timing": fi_timing,
                   **{f"ms_{n}": t for n, t in ms.items()}, **{f"ms_{n}_runs": r for n, r in runs.items()},
                   "fla_over_ours": ms["fla"] / ms["ours"]}
            outs = {"ours": (o1, s1), "fla": (o2, s2)}
            if not refused:
                row.update({"flashinfer_over_ours": ms["flashinfer"] / ms["ours"],
                            "fla_over_flashinfer": ms["fla"] / ms["flashinfer"],
                            "rel_l2_o_ours_vs_flashinfer": _rel(o1.reshape(fo.shape), fo),
                            "rel_l2_state_ours_vs_flashinfer": _rel(s1, fs.transpose(-1, -2))})
                outs["flashinfer"] = (fo, fs.transpose(-1, -2))
            if args.accuracy:
                row.update(fp64_errors(x, norm, outs))
            if args.kernels:
                for n, fn in (("ours", ours), ("fla", peer), ("flashinfer", call)):
                    if n in graphs:
                        row[f"us_per_kernel_{n}"] = per_kernel(fn)
            rows.append(row)
            print(json.dumps(row), flush=True)
        except Exception:
            errors.append({"shape": name, "error": traceback.format_exc()[-3000:]})
            print(f"{name}: {errors[-1]['error']}", file=sys.stderr, flush=True)
        out = {"benchmark": "gdn_flashinfer", "command": "python " + " ".join(sys.argv),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": torch.cuda.get_device_name(),
               "versions": {**_versions(), "flashinfer": getattr(flashinfer, "__version__", "?")},
               "timing": "CUDA-graph replay (FlashInfer: see each row), median of do_bench, lower of two rounds",
               "rows": rows, "errors": errors}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
    if rows:
        summary = summarize(rows)
        out["summary"] = summary
        args.out.write_text(json.dumps(out, indent=1))
        print("summary:", json.dumps(summary))
    if errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
