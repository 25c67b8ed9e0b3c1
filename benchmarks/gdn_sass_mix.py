"""Static instruction mix of the GDN tensor-core kernels (SASS), without a GPU.

The ncu profile of prepare and the shared-memory pass (docs/kernels/gdn.md) shows both issue-bound:
their time follows the instructions they execute. This counts, per kernel, the SASS instructions
nvcc emits for it, by class (tensor-core mma, shared-memory loads, ldmatrix, conversions, exp,
float arithmetic, ...): a change meant to cut instructions can be checked here before it is timed
on a GPU. Counts are static (each instruction once; prepare is straight-line code but for a few
short loops, each pass's body is its loop over chunks); ``loop`` is the kernel's loop with the
most products (the largest loop where none has one), for a pass the code of one chunk (all
branches of its o stores' element types included), not its copying warp's loop.

    python benchmarks/gdn_sass_mix.py --out benchmarks/results/gdn-sass-mix-YYYY-MM-DD.json

Needs nvcc (the build's flags: -O3 --fmad=false, WORKBENCH_CUDA_ARCH's sm) and nvdisasm (the
CUDA toolkit's, or NVDISASM=path; ``pip download nvidia-cuda-nvdisasm`` has one).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.kernels import _native  # noqa: E402

# opcode (before the first '.') -> class; anything else is "other"
CLASSES = {
    "HMMA": "mma", "LDSM": "ldmatrix", "LDS": "lds", "STS": "sts", "LDGSTS": "cp.async",
    "LDG": "ldg", "STG": "stg", "LDC": "ldc", "MUFU": "mufu (exp, rcp)",
    "FFMA": "float", "FMUL": "float", "FADD": "float", "FMNMX": "float", "FSETP": "float", "FSEL": "float",
    "HGMMA": "wgmma", "WARPGROUP": "wgmma sync",
    "F2F": "convert", "F2FP": "convert", "PRMT": "convert", "I2F": "convert", "F2I": "convert", "FRND": "convert",
    "IMAD": "integer", "IADD3": "integer", "LEA": "integer", "SHF": "integer", "LOP3": "integer",
    "ISETP": "integer", "IMNMX": "integer", "SEL": "integer", "MOV": "move", "S2R": "move", "CS2R": "move",
    "BAR": "barrier", "BRA": "branch", "BSSY": "branch", "BSYNC": "branch", "EXIT": "branch",
    "NOP": "nop",
}
INSN = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def nvdisasm() -> str:
    for c in (os.environ.get("NVDISASM"), shutil.which("nvdisasm"),
              str(Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "nvdisasm")):
        if c and Path(c).is_file():
            return c
    raise SystemExit("nvdisasm not found: set NVDISASM or install the CUDA toolkit "
                     "(pip download nvidia-cuda-nvdisasm has one)")


def sm_arch() -> str:
    arch = os.environ.get("WORKBENCH_CUDA_ARCH", "-gencode=arch=compute_90a,code=sm_90a")
    m = re.search(r"code=(sm_\w+)", arch)
    return m.group(1) if m else "sm_90a"


def kernel_mix(sass: str) -> dict:
    """{kernel name: Counter of classes} from nvdisasm's listing."""
    out, name = {}, None
    for line in sass.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            name = m.group(1)
            out[name] = Counter()
            continue
        m = INSN.match(line)
        if m and name:
            out[name][CLASSES.get(m.group(1).split(".")[0], "other")] += 1
    return out


def main_loops(sass: str) -> dict:
    """{kernel name: (instructions, mma)} of each kernel's loop with the most tensor-core products
    (a backward branch's range in the listing; the largest of those, and the largest loop where
    none has a product): a pass's loop over chunks, the code it runs once a chunk (inner loops
    counted once; meaningful for the passes only), not its copying warp's loop, which may be
    longer (the column pass's producer forms)."""
    out, name, body, labels = {}, None, [], {}

    def close():
        if name is None:
            return
        best = (0, 0)
        for i, (op, rest) in enumerate(body):
            m = re.search(r"`\(\.(L_x_\d+)\)", rest) if op == "BRA" else None
            if m and labels.get(m.group(1), i + 1) <= i:
                seg = body[labels[m.group(1)]:i + 1]
                mma = sum(o in ("HMMA", "HGMMA") for o, _ in seg)
                best = max(best, (mma, len(seg)))
        out[name] = (best[1], best[0])

    for line in sass.splitlines():
        m = re.match(r"^\.text\.(\S+):", line)
        if m:
            close()
            name, body, labels = m.group(1), [], {}
            continue
        m = re.match(r"^\.(L_x_\d+):", line)
        if m:
            labels[m.group(1)] = len(body)
            continue
        m = INSN.match(line)
        if m and name:
            body.append((m.group(1).split(".")[0], line))
    close()
    return out


TEMPLATE_ARG = re.compile(r"Li(\d+)E|Lb([01])E|(6__half|13__nv_bfloat16|f)")
TYPES = {"6__half": "fp16", "13__nv_bfloat16": "bf16", "f": "fp32"}


def short(name: str) -> str:
    """mma_prepare<128, bf16, 0>, mma_wpass<128, bf16, 4>, mma_wcpass<64, 16, 1>, ... from a
    mangled name (its template arguments in order: integers, bools as 0 / 1, element types)."""
    for m in re.finditer(r"(\d+)(mma_)", name):  # the length-prefixed function name
        fn = name[m.start(2):m.start(2) + int(m.group(1))]
        if not fn.startswith("mma_"):
            continue
        rest = name[m.start(2) + len(fn):]
        if not rest.startswith("I"):
            return fn
        args, pos = [], 1
        while (a := TEMPLATE_ARG.match(rest, pos)):
            args.append(a.group(1) or a.group(2) or TYPES[a.group(3)])
            pos = a.end()
        return f"{fn}<{', '.join(args)}>" if args else fn
    return name


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--source", default="gdn/gdn_mma.cu")
    args = ap.parse_args()
    nvcc = _native.find_nvcc()
    if nvcc is None:
        raise SystemExit("nvcc not found")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cmd = [nvcc, "-cubin", "-O3", "-std=c++17", "--fmad=false", f"-arch={sm_arch()}",
               f"-I{_native.source_dir()}", str(_native.source_dir() / args.source), "-o", str(cubin)]
        subprocess.run(cmd, check=True)
        sass = subprocess.run([nvdisasm(), "-c", str(cubin)], check=True, capture_output=True,
                              text=True).stdout
    rows, loops = [], main_loops(sass)
    for name, mix in sorted(kernel_mix(sass).items(), key=lambda kv: short(kv[0])):
        total = sum(mix.values())
        # the passes' loop over chunks (prepare and the norms run no loop of that kind)
        loop, loop_mma = loops.get(name, (0, 0)) if "pass" in short(name) else (None, None)
        mma = mix["mma"] + mix["wgmma"]  # mma.sync (HMMA) and wgmma (HGMMA) instructions
        rows.append({"kernel": short(name), "total": total, "mma": mma,
                     "non_mma_per_mma": round((total - mma) / max(mma, 1), 2),
                     "loop": loop, "loop_mma": loop_mma,
                     "mix": dict(mix.most_common()), "mangled": name})
        lp = f"loop {loop:5d} ({loop_mma} mma)" if loop is not None else " " * 20
        print(f"{short(name):32s} total {total:6d}  mma {mma:5d}  {lp}  "
              + "  ".join(f"{k} {v}" for k, v in mix.most_common() if k not in ("mma", "wgmma")))
    if args.out:
        ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
        out = {"benchmark": "gdn_sass_mix", "command": "python " + " ".join(sys.argv),
               "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "nvcc": ver, "arch": sm_arch(), "source": args.source,
               "note": "static SASS instruction counts per kernel (each instruction once); loop: the "
                       "kernel's loop with the most products (a pass's loop over chunks; its "
                       "inner loops once)", "rows": rows}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
