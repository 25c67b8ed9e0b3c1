"""Benchmark the GDN kernels on a GPU: batched decode and chunked prefill, our numba and ext
kernels against flash-linear-attention (fla) in the same process.

Correctness first: every backend is compared with the FP64 oracle on the benchmark shapes before
anything is timed. Times are medians of triton.testing.do_bench (L2 flushed between runs) or, without
triton, of CUDA events. Shapes are Qwen3.5-like: H=16, HV=32, K=V=128, bf16 inputs, fp32 state;
q and k are L2-normalized up front so no backend spends time on it.

Kernel-level timings launch our kernels on inputs already staged to float32 (``launch``); the
``api`` timings go through ``workbench.kernels.gdn`` and include staging (casts, state copy).
Ratio = fla time / our time (above 1: ours is faster). ``graph_*`` entries time a CUDA-graph
replay of the same call (no Python launch cost), as a serving engine's graphed decode sees it.
Prefill ``ext`` is the CUDA chunked path the backend picks for bf16 inputs (``mma``: tensor
cores, tf32 operands, o written in bf16 like fla's); ``ext_scalar`` is the plain-fp32 path (the
default for fp32 inputs; o in float32).
``--only`` keeps the named runners (and fla).

    python benchmarks/gdn.py --out benchmarks/results/gdn-h200-YYYYMMDD.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workbench  # noqa: E402
from workbench.kernels import gdn  # noqa: E402
from workbench.kernels.gdn import _launch, ext, numba_cuda, oracle  # noqa: E402
from workbench.kernels.gdn._cases import make_inputs  # noqa: E402

H, HV, K, V = 16, 32, 128, 128
DECODE_B = (1, 16, 64, 256)
PREFILL_T = (8192, 32768)


def _bench(fn) -> float:
    """Median milliseconds of fn()."""
    try:
        from triton.testing import do_bench
        return float(do_bench(fn, warmup=25, rep=200, return_mode="median"))
    except ImportError:
        for _ in range(5):
            fn()
        times = []
        for _ in range(50):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(); fn(); b.record(); b.synchronize()
            times.append(a.elapsed_time(b))
        return float(sorted(times)[len(times) // 2])


def _graphed(fn):
    """fn captured in a CUDA graph, so a replay measures the GPU work without Python launch cost
    (as a serving engine that graphs its decode step sees it)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _time_all(run: dict) -> tuple[dict, dict]:
    """Eager and CUDA-graph medians (ms) of every runner; None where one fails."""
    eager, graph = {}, {}
    for name, fn in run.items():
        try:
            eager[name] = _bench(fn)
        except Exception:
            eager[name] = None
            print(name, "failed:", traceback.format_exc()[-800:])
        if name.endswith("_api"):
            continue
        try:
            graph[name] = _bench(_graphed(fn))
        except Exception as e:
            graph[name] = None
            print(name, "graph capture failed:", f"{type(e).__name__}: {e}"[:300])
    return eager, graph


def _ratios(res: dict) -> dict:
    """fla's time over each runner's (ext_qk_l2norm against fla with its in-kernel norm)."""
    peer = lambda n: "fla_qk_l2norm" if n == "ext_qk_l2norm" else "fla"
    return {n: (res[peer(n)] / t if t and res.get(peer(n)) else None) for n, t in res.items()
            if not n.startswith("fla")}


def _versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda}
    for name in ("triton", "numba", "numba_cuda", "fla", "numpy"):
        try:
            mod = __import__(name)
            out[name] = getattr(mod, "__version__", "?")
        except Exception as e:
            out[name] = f"unavailable ({type(e).__name__})"
    return out


def _inputs(B, T, seed=0):
    x = make_inputs(B, T, H, HV, K, V, dtype=torch.bfloat16, state=True, seed=seed, device="cuda")
    from workbench.kernels.gdn._checks import l2norm
    x["q"], x["k"] = l2norm(x["q"].float()).bfloat16(), l2norm(x["k"].float()).bfloat16()
    return x


def _fla():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


ONLY: set = set()


def _want(name):
    return not ONLY or name in ONLY or name == "fla"


def _runners(x, op):
    """{name: zero-argument callable} for one problem; ``op`` is 'decode' or 'prefill'."""
    s, _, _, tensors, state, _ = _launch.stage("ext", **x, scale=None, qk_l2norm=False, policy=None)
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=torch.float32, device="cuda")
    st_n, st_e = state.clone(), state.clone()
    run = {}
    if op == "decode":
        run["numba"] = lambda: numba_cuda.launch("decode", s, 64, tensors, st_n, o)
        run["ext"] = lambda: ext.launch("recurrent", s, 64, 0, tensors, st_e, o)
        run["numba_api"] = lambda: gdn.recurrent(**x, backend="numba")
        run["ext_api"] = lambda: gdn.recurrent(**x, backend="ext")
    else:
        run["numba"] = lambda: numba_cuda.launch("chunked", s, 64, tensors, st_n, o)
        # what the API hands the kernels: on the mma path bf16 q, k, v as given, and o written in
        # the output dtype (bf16 here, as fla does); the scalar path reads and writes float32
        api = ext.staged("chunked", **x)
        path = api.path
        o_ext = o.to(x["v"].dtype) if path == "mma" else o
        run["ext"] = lambda: ext.launch("chunked", s, 64, 0, api.tensors, st_e, o_ext, path=path)
        if path == "mma":  # the same kernels fed float32-widened q, k, v
            run["ext_f32_inputs"] = lambda: ext.launch("chunked", s, 64, 0, tensors, st_e, o_ext,
                                                       path=path)
            # and on the same (already normalized) q, k with qk_l2norm=True: the kernels compute
            # and apply the norms, as a model calling with in-kernel normalization has them do
            l2 = ext.staged("chunked", **x, qk_l2norm=True)
            run["ext_qk_l2norm"] = lambda: ext.launch("chunked", s, 64, 0, l2.tensors, st_e, o_ext,
                                                      path=path, qk_l2norm=l2.qk_l2norm)
        run["ext_scalar"] = lambda: ext.launch("chunked", s, 64, 0, tensors, st_e, o,
                                               path="scalar")
        if s.T <= 8192:
            if _want("numba_phase1_prepare"):
                run.update(_numba_phases(s, tensors, state.clone(), o.clone()))
            run["numba_recurrent"] = lambda: numba_cuda.launch("recurrent", s, 64, tensors, st_n, o)
            run["ext_recurrent"] = lambda: ext.launch("recurrent", s, 64, 0, tensors, st_e, o)
    run = {n: f for n, f in run.items() if _want(n)}
    try:
        chunk, fused = _fla()
        kw = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"].bfloat16(),
                  scale=K ** -0.5, initial_state=x["initial_state"], output_final_state=True)
        run["fla"] = (lambda: fused(**kw)) if op == "decode" else (lambda: chunk(**kw))
        if op != "decode" and _want("ext_qk_l2norm"):
            run["fla_qk_l2norm"] = lambda: chunk(**kw, use_qk_l2norm_in_kernel=True)
    except Exception as e:
        print("fla unavailable:", e)
    return s, run


def _numba_phases(s, tensors, state, o, C=64):
    """The three launches of numba's chunked form, one runner each (where the time goes)."""
    nc = numba_cuda
    q, k, v, g, beta = tensors
    NC, cfg, dev = (s.T + C - 1) // C, nc._config(s.K, s.V, C), q.device
    f32 = dict(dtype=torch.float32, device=dev)
    gcum, W, U = (torch.empty(s.B, s.HV, s.T, **f32), torch.empty(s.B, s.HV, s.T, s.K, **f32),
                  torch.empty(s.B, s.HV, s.T, s.V, **f32))
    pbv = cfg["pass_bv"]
    run = {
        "numba_phase1_prepare": lambda: nc._go(nc._kernel("prepare", s.K, s.V, C), s.B * s.HV * NC,
                                               cfg["phase"], [k, v, g, beta, gcum, W, U, s.T, s.H,
                                                              s.HV, NC], dev),
        "numba_phase2_state_pass": lambda: nc._go(
            nc._kernel("state_pass", s.K, s.V, C), (s.B * s.HV, (s.V + pbv - 1) // pbv),
            cfg["pass_threads"], [q, k, gcum, W, U, o, state, s.T, s.H, s.HV, s.V], dev),
        "numba_phase3_output": lambda: nc._go(nc._kernel("output", s.K, s.V, C), s.B * s.HV * NC,
                                              cfg["phase"], [q, k, gcum, U, o, s.T, s.H, s.HV, NC,
                                                             s.scale], dev),
    }
    run["numba_phase1_prepare"]()
    return run


def correctness(report):
    rows = []
    cases = [("recurrent", 16, 1), ("recurrent", 1, 8192), ("chunked", 1, 8192)]
    for op, B, T in cases:
        x = _inputs(B, T, seed=1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        ref_o, ref_s = oracle.chunked(**x)
        torch.cuda.synchronize()
        ref_t = time.perf_counter() - t0
        for backend in ("torch", "numba", "ext", "fla"):
            row = dict(op=op, B=B, T=T, backend=backend)
            try:
                o, st = getattr(gdn, op)(**x, backend=backend)
                row.update(o_rel_l2=workbench.compare(ref_o, o).rel_l2,
                           state_rel_l2=workbench.compare(ref_s, st).rel_l2)
                row["ok"] = row["o_rel_l2"] <= 5e-3 and row["state_rel_l2"] <= 5e-3
            except Exception as e:
                row["error"] = f"{type(e).__name__}: {e}"[:500]
            print(row, flush=True)
            rows.append(row)
        if T == 8192 and op == "chunked":
            report["oracle_chunked_fp64_T8192_s"] = ref_t
    report["correctness"] = rows
    # the oracle's step-by-step recurrence at T = 8192, for the record
    x = _inputs(1, 8192, seed=1)
    oracle.chunked(**{k: (v[:, :64] if k != "initial_state" else v) for k, v in x.items()})
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    oracle.chunked(**x)
    torch.cuda.synchronize()
    report["oracle_chunked_fp64_T8192_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    oracle.recurrent(**x)
    torch.cuda.synchronize()
    report["oracle_recurrent_fp64_T8192_s"] = time.perf_counter() - t0


def copy_bandwidth() -> float:
    a = torch.empty(2 * 1024 ** 3 // 4, dtype=torch.float32, device="cuda")
    b = torch.empty_like(a)
    ms = _bench(lambda: b.copy_(a))
    return 2 * a.numel() * 4 / (ms * 1e-3) / 1e12


def decode(report):
    rows = []
    for B in DECODE_B:
        x = _inputs(B, 1, seed=2)
        s, run = _runners(x, "decode")
        state_bytes = 2 * B * HV * K * V * 4
        res, gres = _time_all(run)
        tbps = lambda r: {n: (state_bytes / (t * 1e-3) / 1e12 if t else None) for n, t in r.items()}
        row = dict(B=B, state_bytes=state_bytes, ms=res, state_TBps=tbps(res),
                   ratio_vs_fla=_ratios(res), graph_ms=gres, graph_state_TBps=tbps(gres),
                   graph_ratio_vs_fla=_ratios(gres))
        print(json.dumps(row), flush=True)
        rows.append(row)
    report["decode"] = rows


def _chunk_flops(T):
    C = 64
    n = T // C
    per = 4 * C * C * K + 4 * C * K * V + C * C * V + 2 * C * C * V + 2 * C * K * V
    return n * per * HV


def prefill(report):
    rows = []
    for T in PREFILL_T:
        x = _inputs(1, T, seed=3)
        s, run = _runners(x, "prefill")
        res, gres = _time_all(run)
        io_bytes = T * (2 * H * K + 2 * HV * V) * 2 + 2 * HV * K * V * 4
        row = dict(B=1, T=T, ms=res, nominal_flop=_chunk_flops(T),
                   TFLOPs={n: (_chunk_flops(T) / (t * 1e-3) / 1e12 if t else None)
                           for n, t in res.items()},
                   io_GBps={n: (io_bytes / (t * 1e-3) / 1e9 if t else None) for n, t in res.items()},
                   ratio_vs_fla=_ratios(res), graph_ms=gres, graph_ratio_vs_fla=_ratios(gres),
                   ext_path=ext.cuda_path(s, 64, 0, x["q"].dtype))
        print(json.dumps(row), flush=True)
        rows.append(row)
    report["prefill"] = rows


def kernel_times(report, T=8192):
    """Per-kernel GPU time (torch.profiler) of one ext chunked call on each CUDA path."""
    from torch.profiler import ProfilerActivity, profile
    x = _inputs(1, T, seed=3)
    s, _, _, tensors, state, _ = _launch.stage("ext", **x, scale=None, qk_l2norm=False, policy=None)
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=torch.float32, device="cuda")
    out = {}
    for path in ("mma", "scalar"):
        fn = lambda: ext.launch("chunked", s, 64, 0, tensors, state.clone(), o, path=path)
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
        out[path] = {e.key[:60]: e.device_time_total / 3 / 1e3 for e in prof.key_averages()
                     if e.device_time_total > 0}
        print(path, json.dumps(out[path]), flush=True)
    report[f"ext_kernel_ms_T{T}"] = out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--skip", nargs="*", default=[], choices=["correctness", "decode", "prefill", "kernels"])
    ap.add_argument("--only", nargs="*", default=[], help="runner names to time (fla always)")
    args = ap.parse_args()
    ONLY.update(args.only)
    report = dict(command=" ".join([Path(sys.executable).name, *sys.argv]),
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  device=torch.cuda.get_device_name(), versions=_versions(),
                  shapes=dict(H=H, HV=HV, K=K, V=V, dtype="bf16", state="fp32"),
                  backends=gdn_backends())
    report["copy_TBps"] = copy_bandwidth()
    print("copy TB/s", report["copy_TBps"], flush=True)
    for name, fn in (("correctness", correctness), ("decode", decode), ("prefill", prefill),
                     ("kernels", kernel_times)):
        if name in args.skip:
            continue
        try:
            fn(report)
        except Exception:
            report[f"{name}_error"] = traceback.format_exc()[-2000:]
            print(report[f"{name}_error"])
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
    print("wrote", args.out)


def gdn_backends():
    from workbench.kernels import backends
    df = backends("gdn")
    return {r.name: dict(available=bool(r.available), reason=r.reason) for r in df.itertuples()}


if __name__ == "__main__":
    main()
