"""Is a change to the GDN mma kernels bit-equal? The working tree's kernels/gdn/gdn_mma.cu against
another revision's, both built with g++ under the CPU emulation of CUDA (kernels/common/cuda_emu.h,
workbench.kernels.gdn.mma_emu), on the same inputs: o and the final state compared bit for bit
(NaN-safe: bit patterns), per pass, shape, dtype, norm and packed batch. Needs no GPU.

    python benchmarks/gdn_emu_bitwise.py --base f776fa0 --out benchmarks/results/gdn-emu-bitwise-YYYY-MM-DD.json

The emulation's arithmetic is deterministic and follows the kernels' own choices of operands,
roundings and order, so a change that keeps them keeps the bits here; the GPU's bits additionally
depend on its own rounding of the tensor cores' sums and expf, which a change to the kernels'
code does not touch. Revisions from before the emulation (2026-12-05) get its hooks added to
their source first (the PTX helpers and launch syntax of that era; an unknown form is an error).
The workspace passed is large enough for either layout (gcum and 8512 floats a chunk).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.kernels import _native  # noqa: E402
from workbench.kernels._abi import GdnArgs  # noqa: E402
from workbench.kernels.gdn import ext, mma_emu  # noqa: E402
from workbench.kernels.gdn._cases import make_inputs, packed_inputs  # noqa: E402
from workbench.kernels.gdn._launch import stage  # noqa: E402
from workbench.numerics.policy import Policy  # noqa: E402


def add_emu_hooks(src: str) -> str:
    """The emulation's hooks for a gdn_mma.cu from before they existed (2026-12-05)."""
    if "WB_MMA_EMU" in src:
        return src

    def sub(pattern, repl, count=1, flags=re.S):
        nonlocal src
        src, n = re.subn(pattern, repl, src, flags=flags)
        if n != count and count >= 0:
            raise SystemExit(f"cannot add the emulation's hooks: {pattern!r} matched {n} times, not {count}")

    sub(r"#include <cuda_bf16.h>\n#include <cuda_fp16.h>\n#include <cuda_runtime.h>\n",
        '#include "common/cuda_emu.h"\n')
    sub(r"(tf32_bits\(float x\) \{\n).*?\n\}", r"\1  return wbemu::cvt_rna_tf32(x);\n}")
    sub(r"(if constexpr \(CVT\) \{\n)\s*uint32_t r;\n\s*asm\(\"cvt[^\n]*\n\s*return r;",
        r"\1    return wbemu::cvt_rna_tf32(x);")
    sub(r"(uint32_t b1\) \{\n)\s*asm volatile\(\n\s*\"mma\.sync.*?\);\n\}",
        r"\1  wbemu::mma_m16n8k8_tf32(d, a, b0, b1);\n}")
    sub(r"const unsigned s = \(unsigned\)__cvta_generic_to_shared\(dst\);\n\s*asm volatile\(\"cp\.async\.ca[^\n]*",
        "wbemu::cp_async(dst, src, 4);", count=-1)
    sub(r"asm volatile\(\"cp\.async\.commit_group;\"\);", "wbemu::cp_async_commit();")
    sub(r"asm volatile\(\"cp\.async\.wait_group %0;\" ::\"n\"\(N\)\);", "wbemu::cp_async_wait(N);")
    sub(r"(ldsm4\(uint32_t \(&r\)\[4\], const void\* row\) \{\n).*?\n\}\n",
        r"\1  wbemu::ldmatrix_x4<TRANS>(r, row);\n}\n")
    sub(r"\n\s*const unsigned ds = \(unsigned\)__cvta_generic_to_shared\(d\);", "")
    sub(r"asm volatile\(\"cp\.async\.cg\.shared\.global \[%0\], \[%1\], 16;\" ::\"r\"\(\s*"
        r"ds \+ \(unsigned\)\(it \* RS \* LD \* sizeof\(T\)\)\), \"l\"\(s\)\);",
        "wbemu::cp_async(d + it * RS * LD, s, 16);")
    sub(r"asm volatile\(\"bar\.sync 1, 64;\" ::: \"memory\"\);", "wbemu::named_barrier(1, 64);")
    sub(r"extern __shared__ float4 smem4\[\];", "WB_DYNAMIC_SMEM(float4, smem4);", count=-1)
    # kernel<<<grid, block, smem, stream>>>(  ->  WB_LAUNCH(grid, block, smem, stream, kernel)(
    sub(r"([A-Za-z_0-9]+(?:<[^<>;]*>)?)<<<(.*?), ([^,<>]*?), ([^,<>]*?), s>>>\(",
        r"WB_LAUNCH(\2, \3, \4, s, \1)(", count=-1)
    if "<<<" in src or "asm" in src.replace("asm volatile(\"bar", ""):
        raise SystemExit("cannot add the emulation's hooks: PTX or a launch left in the base source")
    return src


def build(src: str, tmp: Path, name: str) -> ctypes.CDLL:
    d = tmp / name
    (d / "gdn").mkdir(parents=True)
    (d / "gdn" / "gdn_mma.cu").write_text(src)
    unit = d / "emu.cpp"
    unit.write_text((_native.source_dir() / "gdn" / "gdn_mma_emu.cpp").read_text())
    out = d / "lib.so"
    cmd = _native._command("cpu", [unit], out, [])
    cmd.insert(1, f"-I{d}")  # this revision's gdn/gdn_mma.cu before the tree's
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(out))
    lib.gdn_chunked_mma_cuda.argtypes = [ctypes.POINTER(GdnArgs)]
    lib.gdn_chunked_mma_cuda.restype = ctypes.c_int
    lib.gdn_chunked_mma_varlen_cuda.argtypes = [ctypes.POINTER(GdnArgs), ctypes.c_void_p, ctypes.c_int]
    lib.gdn_chunked_mma_varlen_cuda.restype = ctypes.c_int
    return lib


def run(lib, x, qk_l2norm, out, cu=None, h0=None):
    s, _, C, t, state, _ = stage("ext", x["q"], x["k"], x["v"], x["g"], x["beta"], None,
                                 None if cu else x.get("initial_state"), False, Policy(), None, widen=False)
    if cu is not None:
        state = h0.clone()
    o = torch.full((s.B, s.T, s.HV, s.V), float("nan"), dtype=out)
    a = GdnArgs.of(q=t[0], k=t[1], v=t[2], g=t[3], beta=t[4], o=o, state=state, B=s.B, T=s.T, H=s.H,
                   HV=s.HV, K=s.K, V=s.V, scale=s.scale, chunk=64, acc64=0)
    nc = -(-s.T // 64) if cu is None else sum(-(-(b - a_) // 64) for a_, b in zip(cu[:-1], cu[1:]))
    ws = [torch.zeros(s.B, s.HV, max(nc, 1), ext.MMA_CHUNK_WS), torch.zeros(s.B, s.HV, s.T)]
    if qk_l2norm:
        ws += [torch.empty(s.B, s.T, s.H) for _ in range(2)]
        a.nq, a.nk = ws[2].data_ptr(), ws[3].data_ptr()
    a.tinv, a.gcum = ws[0].data_ptr(), ws[1].data_ptr()
    a.in_dtype, a.o_dtype = ext.MMA_IN[t[0].dtype], ext.MMA_OUT[out]
    if cu is None:
        rc = lib.gdn_chunked_mma_cuda(ctypes.byref(a))
    else:
        rc = lib.gdn_chunked_mma_varlen_cuda(ctypes.byref(a), (ctypes.c_int * len(cu))(*cu), len(cu) - 1)
    if rc != 0:
        raise SystemExit(f"launch failed: status {rc}")
    return o, state


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    a, b = a.contiguous(), b.contiguous()
    view = torch.int32 if a.dtype == torch.float32 else torch.int16
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(view), b.view(view))


CASES = [  # B, T, H, HV, K, V, dtype, qk_l2norm
    (2, 150, 2, 4, 128, 128, torch.bfloat16, True),
    (1, 70, 1, 2, 64, 96, torch.float16, True),
    (1, 1, 1, 2, 128, 32, torch.float32, False),
    (1, 200, 2, 2, 64, 64, torch.bfloat16, False),   # raw keys: the recurrence overflows (NaN, inf)
    (1, 130, 2, 2, 128, 64, torch.float32, True),
]
PACKED = [0, 1, 5, 67, 0, 130, 64]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="git revision whose gdn_mma.cu is the reference")
    ap.add_argument("--passes", nargs="+", default=["smem", "warp"],
                    help="passes both revisions have (WORKBENCH_GDN_MMA_PASS values)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    base_src = subprocess.run(["git", "show", f"{args.base}:kernels/gdn/gdn_mma.cu"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "kernels"], cwd=ROOT, capture_output=True,
                                text=True).stdout.strip())
    with tempfile.TemporaryDirectory() as tmp:
        base = build(add_emu_hooks(base_src), Path(tmp), "base")
        cur = build((_native.source_dir() / "gdn" / "gdn_mma.cu").read_text(), Path(tmp), "tree")
        rows = []
        for p in args.passes:
            os.environ["WORKBENCH_GDN_MMA_PASS"] = p
            for B, T, H, HV, K, V, dt, qk in CASES:
                x = make_inputs(B, T, H, HV, K, V, dtype=dt, state=True, seed=11)
                for out in dict.fromkeys((torch.float32, dt)):
                    (o1, s1), (o2, s2) = run(base, x, qk, out), run(cur, x, qk, out)
                    rows.append({"pass": p, "shape": f"B{B} T{T} H{H} HV{HV} K{K} V{V}", "dtype": str(dt),
                                 "qk_l2norm": qk, "o_dtype": str(out), "finite_o": float(torch.isfinite(o1.float()).float().mean()),
                                 "o_bits_equal": same_bits(o1, o2), "state_bits_equal": same_bits(s1, s2)})
                    print(json.dumps(rows[-1]), flush=True)
            x = packed_inputs(PACKED, H=1, HV=2, K=64, V=64, dtype=torch.bfloat16, seed=3)
            cu, h0 = x.pop("cu_seqlens"), x.pop("initial_state")
            (o1, s1), (o2, s2) = run(base, x, True, torch.bfloat16, cu, h0), run(cur, x, True, torch.bfloat16, cu, h0)
            rows.append({"pass": p, "shape": f"packed {PACKED} HV2 K64 V64", "dtype": "torch.bfloat16",
                         "qk_l2norm": True, "o_dtype": "torch.bfloat16", "finite_o": 1.0,
                         "o_bits_equal": same_bits(o1, o2), "state_bits_equal": same_bits(s1, s2)})
            print(json.dumps(rows[-1]), flush=True)
    os.environ.pop("WORKBENCH_GDN_MMA_PASS", None)
    summary = {"cases": len(rows), "all_bits_equal": all(r["o_bits_equal"] and r["state_bits_equal"] for r in rows)}
    result = {"benchmark": "gdn_emu_bitwise", "command": "python " + " ".join(sys.argv),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": f"{os.cpu_count()} CPUs, no GPU (emulation)", "base": args.base,
              "tree": head + (" (+ uncommitted kernels/)" if dirty else ""),
              "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                           "cxx": _native._version(_native.find_cxx()).splitlines()[0]},
              "summary": summary, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print("summary:", json.dumps(summary))
    return 0 if summary["all_bits_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
