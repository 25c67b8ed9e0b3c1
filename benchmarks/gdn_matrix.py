"""GDN kernels against fla over a matrix of shapes, side by side in one run; the summary reports
the minimum ratio across shapes, not the best shape.

Prefill: ``gdn.chunked(backend="ext")`` (the public call) against fla's ``chunk_gated_delta_rule``
over B, T, H, HV, K/V, packed varlen batches (``cu_seqlens``: ext's tensor-core path runs the
packed batch in one launch pair per 128 sequences, fla its own packed kernel) and the q/k L2 norm
in the kernel or done up front. Each row records the code path ext took (``kernel_log``: the mma
pass, ``mma/smem`` or ``mma/warpN``). Decode (T = 1): ext
and numba ``gdn.recurrent`` (the public call: bf16 q, k, v, float32 g, beta and state, bf16 o)
against fla's ``fused_recurrent_gated_delta_rule`` at B = 1..256, with and without the L2 norm in
the kernel.
Every call is captured in a CUDA graph and the replay timed (median of triton's do_bench), so
Python launch cost is out of both sides; a prefill shape times ours and fla interleaved, twice
each, and keeps the lower median of each side. ratio = fla time / ours (above 1: ours is faster).
Correctness is checked on each shape first (rel L2 of o against fla's and against the FP64 oracle
on the first shape of each kind).

    python benchmarks/gdn_matrix.py --out benchmarks/results/gdn-matrix-h200-YYYY-MM-DD.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdn import _bench, _fla, _graphed, _versions  # noqa: E402

import workbench  # noqa: E402
from workbench.kernels import gdn  # noqa: E402
from workbench.kernels.registry import kernel_log  # noqa: E402
from workbench.kernels.gdn._cases import make_inputs  # noqa: E402
from workbench.kernels.gdn._checks import l2norm  # noqa: E402

# (name, B, T or lengths, H, HV, K, V, norm in kernel)
PREFILL = [
    ("B1 T8192 H16 HV32", 1, 8192, 16, 32, 128, 128, False),
    ("B1 T32768 H16 HV32", 1, 32768, 16, 32, 128, 128, False),
    ("B4 T4096 H16 HV32", 4, 4096, 16, 32, 128, 128, False),
    ("B1 T2000 H16 HV48", 1, 2000, 16, 48, 128, 128, False),
    ("B8 T1000 H16 HV32", 8, 1000, 16, 32, 128, 128, False),
    ("B2 T3001 H8 HV32 norm-in-kernel", 2, 3001, 8, 32, 128, 128, True),
    ("B1 T16384 H16 HV64", 1, 16384, 16, 64, 128, 128, False),
    ("B1 T4096 H16 HV32 K64 V64", 1, 4096, 16, 32, 64, 64, False),
    ("varlen 5 seqs (1000,3001,500,2048,77) H16 HV32", 1, [1000, 3001, 500, 2048, 77], 16, 32, 128, 128, False),
    ("varlen 16 seqs of 512 H16 HV32", 1, [512] * 16, 16, 32, 128, 128, False),
    ("varlen 64 seqs of 256 H16 HV32", 1, [256] * 64, 16, 32, 128, 128, False),
]
DECODE_B = (1, 16, 64, 256)


def _inputs(B, T, H, HV, K, V, norm_in_kernel, seed=0):
    x = make_inputs(B, T, H, HV, K, V, dtype=torch.bfloat16, state=True, seed=seed, device="cuda")
    if not norm_in_kernel:
        x["q"], x["k"] = l2norm(x["q"].float()).bfloat16(), l2norm(x["k"].float()).bfloat16()
    return x


def _rel(a, b):
    return float(workbench.compare(a.float().cpu(), b.float().cpu()).rel_l2)


def prefill_calls(chunk, B, T, H, HV, K, V, norm, keep=None):
    """One prefill shape's inputs and its two calls: ours (the public ``gdn.chunked``, ext) and
    fla's ``chunk`` on the same tensors. ``T``: a length, or a list of packed sequence lengths
    (``cu_seqlens``, one initial state per sequence). Returns (ours, peer, lengths or None, total
    tokens, q's dtype); ``keep``, a dict, receives the inputs (q, k, v, g, beta, initial_state,
    cu_seqlens) for a third peer."""
    lengths = T if isinstance(T, list) else None
    total = sum(lengths) if lengths else T
    x = _inputs(B, total, H, HV, K, V, norm)
    cu, s0 = None, x["initial_state"]
    if lengths:
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        s0 = (0.1 * torch.randn(len(lengths), HV, K, V, device="cuda"))
    cu_t = torch.tensor(cu, dtype=torch.long, device="cuda") if cu else None
    extra = {"cu_seqlens": cu_t} if cu else {}
    if keep is not None:
        keep.update(x, initial_state=s0, cu_seqlens=cu_t)

    def ours():
        return gdn.chunked(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=s0, qk_l2norm=norm,
                           cu_seqlens=cu, backend="ext")

    def peer():
        return chunk(q=x["q"], k=x["k"], v=x["v"], g=x["g"].float(), beta=x["beta"].to(x["q"].dtype),
                     initial_state=s0.float(), output_final_state=True, use_qk_l2norm_in_kernel=norm, **extra)
    return ours, peer, lengths, total, x["q"].dtype


def per_kernel(fn, reps=5):
    """{kernel name: GPU microseconds a call} of fn's eager calls (torch.profiler), largest first:
    where each side's time goes (the graphed time minus their sum is launch gaps)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    got = {e.key[:120]: e.device_time_total / reps for e in prof.key_averages() if e.device_time_total > 0}
    return dict(sorted(got.items(), key=lambda kv: -kv[1]))


def prefill(rows, errors, dump=lambda: None, only=None, kernels=False):
    chunk, _ = _fla()
    for name, B, T, H, HV, K, V, norm in PREFILL:
        if only and not any(o in name for o in only):
            continue
        try:
            ours, peer, lengths, total, _ = prefill_calls(chunk, B, T, H, HV, K, V, norm)
            with kernel_log() as log:
                o1, s1 = ours()
            o2, s2 = peer()
            # interleaved, twice each: the lower median of each side (a run's clocks or the
            # peer's autotuned configuration can drift between neighbouring measurements)
            g_ours, g_peer = _graphed(ours), _graphed(peer)
            runs_ours, runs_peer = [], []
            for _ in range(2):
                runs_ours.append(_bench(g_ours))
                runs_peer.append(_bench(g_peer))
            t_ours, t_peer = min(runs_ours), min(runs_peer)
            rows.append({"kind": "prefill", "shape": name, "B": B, "T": total, "H": H, "HV": HV, "K": K, "V": V,
                         "varlen": bool(lengths), "norm_in_kernel": norm, "ours": "ext gdn.chunked",
                         "path": [r["path"] for r in log.summary()], "calls": sum(r["calls"] for r in log.summary()),
                         "ms_ours": t_ours, "ms_fla": t_peer, "ratio": t_peer / t_ours,
                         "ms_ours_runs": runs_ours, "ms_fla_runs": runs_peer,
                         "rel_l2_o_vs_fla": _rel(o1, o2), "rel_l2_state_vs_fla": _rel(s1, s2)})
            if kernels:
                rows[-1]["us_per_kernel_ours"] = per_kernel(ours)
                rows[-1]["us_per_kernel_fla"] = per_kernel(peer)
            print(json.dumps(rows[-1]))
        except Exception:
            errors.append({"shape": name, "error": traceback.format_exc()[-1500:]})
            print(name, "failed", errors[-1]["error"][-400:])
        dump()


def decode(rows, errors, backends=("ext", "numba"), dump=lambda: None):
    _, fused = _fla()
    for B in DECODE_B:
        for norm in (False, True):
            x = _inputs(B, 1, 16, 32, 128, 128, norm, seed=B)
            name = f"B{B} T1 H16 HV32 K128 V128" + (" norm-in-kernel" if norm else "")

            def peer():
                return fused(q=x["q"], k=x["k"], v=x["v"], g=x["g"].float(), beta=x["beta"].to(x["q"].dtype),
                             initial_state=x["initial_state"].float(), output_final_state=True,
                             use_qk_l2norm_in_kernel=norm)
            t_peer = _bench(_graphed(peer))
            o2, s2 = peer()
            for be in backends:
                try:
                    def ours(be=be):
                        return gdn.recurrent(x["q"], x["k"], x["v"], x["g"], x["beta"],
                                             initial_state=x["initial_state"], qk_l2norm=norm, backend=be)
                    o1, s1 = ours()
                    t_ours = _bench(_graphed(ours))
                    rows.append({"kind": "decode", "shape": name, "B": B, "norm_in_kernel": norm,
                                 "ours": f"{be} gdn.recurrent", "ms_ours": t_ours, "ms_fla": t_peer,
                                 "ratio": t_peer / t_ours, "rel_l2_o_vs_fla": _rel(o1, o2),
                                 "rel_l2_state_vs_fla": _rel(s1, s2)})
                    print(json.dumps(rows[-1]))
                except Exception:
                    errors.append({"shape": f"decode {name} {be}", "error": traceback.format_exc()[-1500:]})
                    print(be, name, "failed", errors[-1]["error"][-400:])
                dump()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip", nargs="*", default=[], choices=["prefill", "decode"])
    ap.add_argument("--only", nargs="*", default=None, help="prefill shapes whose name contains one of these")
    ap.add_argument("--kernels", action="store_true",
                    help="also record each prefill side's GPU time per kernel (torch.profiler, eager calls)")
    ap.add_argument("--decode-backends", nargs="+", default=["ext", "numba"], choices=["ext", "numba"])
    args = ap.parse_args()
    rows, errors = [], []
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")

    def least(kind, ours):
        r = [x for x in rows if x["kind"] == kind and x["ours"].startswith(ours)]
        if not r:
            return None
        m = min(r, key=lambda x: x["ratio"])
        return {"min_ratio": m["ratio"], "at": m["shape"], "max_ratio": max(x["ratio"] for x in r), "shapes": len(r)}

    def dump():  # after every row: a run cut short keeps what it measured
        summary = {"prefill ext vs fla chunk": least("prefill", "ext"),
                   "decode ext vs fla fused_recurrent": least("decode", "ext"),
                   "decode numba vs fla fused_recurrent": least("decode", "numba")}
        out = {"benchmark": "gdn_matrix", "command": "python " + " ".join(sys.argv), "date": started,
               "device": torch.cuda.get_device_name(), "versions": _versions(),
               "timing": "CUDA-graph replay, median of triton.testing.do_bench; prefill: ours and fla "
                         "interleaved, twice each, the lower median of each; ratio = fla ms / ours ms",
               "summary": summary, "rows": rows, "errors": errors}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))
        return summary

    if "prefill" not in args.skip:
        prefill(rows, errors, dump, args.only, args.kernels)
    if "decode" not in args.skip:
        decode(rows, errors, args.decode_backends, dump)
    print("summary:", json.dumps(dump()))


if __name__ == "__main__":
    main()
