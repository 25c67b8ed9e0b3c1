"""Drive the ext tensor-core chunked prefill for a profiler (ncu) or a quick per-variant timing.

    python benchmarks/gdn_phases.py --T 8192 --reps 3            # run it (under ncu, say)
    python benchmarks/gdn_phases.py --T 8192 --time              # median ms, event-timed
    python benchmarks/gdn_phases.py --T 8192 --kernels           # GPU time per kernel (profiler)

Inputs as benchmarks/gdn.py (B=1, H=16, HV=32, K=V=128 unless --HV/--K/--V say otherwise, bf16, l2-normalized q/k, a state),
staged once as the API stages them (bf16 q, k, v; ``--f32-inputs``: widened to float32;
``--qk-l2norm``: the kernels normalize q and k); then
``ext.launch(..., path="mma")`` is called ``reps`` times.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.kernels.gdn import _launch, ext, oracle  # noqa: E402
from workbench.kernels.gdn._cases import make_inputs  # noqa: E402
from workbench.kernels.gdn._checks import l2norm  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--T", type=int, default=8192)
    ap.add_argument("--HV", type=int, default=32)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--V", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--f32-inputs", action="store_true", help="widen q, k, v to float32 first")
    ap.add_argument("--qk-l2norm", action="store_true", help="the kernels apply the L2 norm")
    ap.add_argument("--kernels", action="store_true", help="GPU time per kernel (torch.profiler)")
    ap.add_argument("--check", action="store_true", help="compare with the fp64 oracle first")
    a = ap.parse_args()
    x = make_inputs(1, a.T, 16, a.HV, a.K, a.V, dtype=torch.bfloat16, state=True, seed=3, device="cuda")
    x["q"], x["k"] = l2norm(x["q"].float()).bfloat16(), l2norm(x["k"].float()).bfloat16()
    l2 = False
    if a.f32_inputs:
        s, _, _, tensors, state, _ = _launch.stage("ext", **x, scale=None, qk_l2norm=False,
                                                   policy=None)
    else:
        sg = ext.staged("chunked", **x, qk_l2norm=a.qk_l2norm)
        s, tensors, state, l2 = sg.s, sg.tensors, sg.state, sg.qk_l2norm
    o = torch.empty(s.B, s.T, s.HV, s.V, dtype=torch.float32, device="cuda")
    if a.check:
        st = state.clone()
        ext.launch("chunked", s, 64, 0, tensors, st, o, path="mma", qk_l2norm=l2)
        ro, rs = oracle.chunked(**x)
        eo = float((o.double() - ro.double()).norm() / ro.double().norm())
        es = float((st.double() - rs.double()).norm() / rs.double().norm())
        print(f"T={a.T} rel_l2 o {eo:.3e} state {es:.3e}", flush=True)
    fn = lambda: ext.launch("chunked", s, 64, 0, tensors, state.clone(), o, path="mma",
                            qk_l2norm=l2)
    if a.kernels:
        from torch.profiler import ProfilerActivity, profile
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.reps):
                fn()
            torch.cuda.synchronize()
        for e in prof.key_averages():
            if e.device_time_total > 0:
                print(f"T={a.T} {e.device_time_total / a.reps:9.1f} us  {e.key[:90]}", flush=True)
    if a.time:
        from triton.testing import do_bench
        for _ in range(2):  # twice: the spread between repeats is the noise
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            print(f"T={a.T} mma median {ms:.4f} ms", flush=True)
        return
    for _ in range(a.reps):
        fn()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
