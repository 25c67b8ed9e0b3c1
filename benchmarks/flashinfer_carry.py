"""Pack FlashInfer's SM90 GDN prefill (a CuTe DSL kernel) for the GPU machine in two carries.

A device call carries at most 64 MiB, and FlashInfer 0.7.4 with the CuTe DSL it needs is about
80 MB compressed even without FlashInfer's 469 MB of sources (docs/kernels/gdn.md, "Not done /
next steps"). This builds two archives from the projects' own wheels:

- ``fi1.tar.xz``: the DSL's MLIR extension alone (the largest file, ~52 MB under xz);
- ``fi2.tar.xz``: the rest: the DSL's other files, ``cuda-bindings``, ``cuda-pathfinder``,
  ``tvm_ffi``, ``pynvml`` and of FlashInfer the Python files that ``import flashinfer.gdn_prefill``
  loads (traced here on the CPU with this interpreter's wheels of the same versions) plus its
  ``gdn_kernels``, ``cute_dsl``, ``trace`` and ``jit`` packages whole (what a launch may import
  late), and the wheels' metadata.

Unpack both into one folder on the GPU machine (two calls of one warm machine: the second within
its idle window) and ``site.addsitedir`` it (the DSL's ``.pth`` puts its packages on the path):

    python benchmarks/flashinfer_carry.py --out .whl          # here: .whl/fi1.tar.xz, fi2.tar.xz
    # call 1 (carry .whl holding fi1.tar.xz):  mkdir -p /tmp/fi && tar xJf .whl/fi1.tar.xz -C /tmp/fi
    # call 2 (carry .whl holding fi2.tar.xz and site.tar.xz): tar xJf .whl/fi2.tar.xz -C /tmp/fi; ...

Needs pip and network access to PyPI (this machine's), nothing of CUDA.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

WHEELS = ["flashinfer-python==0.7.4", "nvidia-cutlass-dsl==4.8.1", "nvidia-cutlass-dsl-libs-base==4.8.1",
          "nvidia-cutlass-dsl-libs-core==4.8.1", "nvidia-cutlass-dsl-libs-cu13==4.8.1",
          "cuda-bindings==13.5.0", "cuda-pathfinder==1.9.1", "apache-tvm-ffi==0.1.15.post2",
          "nvidia-ml-py==13.615.71"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "any"]
# FlashInfer packages kept whole besides the traced files (a launch may import in them late)
WHOLE = ["flashinfer/gdn_kernels", "flashinfer/cute_dsl", "flashinfer/trace", "flashinfer/jit"]
LIMIT = 60 * 2**20  # each archive, leaving room in a 64 MiB carry


def install(python_version: str, dest: Path, cache: Path) -> None:
    """The wheels for one Python version, unpacked with pip --target (no dependencies)."""
    wheels = cache / python_version
    wheels.mkdir(parents=True, exist_ok=True)
    plat = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", python_version, "--implementation", "cp", *plat,
                    "-d", str(wheels), *WHEELS], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--only-binary=:all:", "--python-version", python_version, "--implementation",
                    "cp", *plat, "--target", str(dest), *map(str, sorted(wheels.glob("*.whl")))],
                   check=True)


TRACE = r"""
import json, site, sys
site.addsitedir(sys.argv[1])
import flashinfer.gdn_prefill as gp
assert gp.chunk_gated_delta_rule_sm90 is not None, "the SM90 DSL kernel did not import"
root = sys.argv[1].rstrip("/") + "/"
print(json.dumps(sorted({m.__file__[len(root):] for m in list(sys.modules.values())
                         if getattr(m, "__file__", None) and m.__file__.startswith(root)})))
"""


def traced(site_dir: Path) -> list[str]:
    """The files under site_dir that importing flashinfer.gdn_prefill loads (this interpreter)."""
    r = subprocess.run([sys.executable, "-c", TRACE, str(site_dir)], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"flashinfer_carry: importing flashinfer.gdn_prefill failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def pack(root: Path, files: list[Path], out: Path) -> int:
    tmp = out.with_suffix(".part")
    with tarfile.open(tmp, "w:xz", preset=6) as tar:
        for f in files:
            tar.add(f, arcname=str(f.relative_to(root)))
    os.replace(tmp, out)  # whole or not at all
    return out.stat().st_size


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for fi1.tar.xz and fi2.tar.xz")
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12)")
    ap.add_argument("--work", type=Path, default=None, help="download / staging folder (default: temporary)")
    args = ap.parse_args()
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    with tempfile.TemporaryDirectory() as tmpd:
        work = args.work or Path(tmpd)
        target, local = work / f"site-{args.python}", work / f"site-{here}"
        for ver, dest in ((args.python, target), (here, local)):
            if not dest.exists():
                install(ver, dest, work / "wheels")
        names = traced(local)
        # FlashInfer's traced Python files by name; the others' packages whole (their compiled
        # modules are named for the target's Python)
        keep: set[Path] = set()
        for n in names:
            if n.startswith("flashinfer/") and n.endswith(".py"):
                keep.add(target / n)
        for d in WHOLE:
            keep.update(p for p in (target / d).rglob("*") if p.is_file())
        for top in target.iterdir():
            if top.name.startswith("flashinfer"):
                if top.name.endswith(".dist-info"):
                    keep.update(p for p in top.rglob("*") if p.is_file())
                continue
            keep.update([top] if top.is_file() else (p for p in top.rglob("*") if p.is_file()))
        keep = {p for p in keep if p.exists() and "__pycache__" not in p.parts
                and "aarch64" not in str(p) and "qnx" not in str(p)}
        big = max(keep, key=lambda p: p.stat().st_size)
        args.out.mkdir(parents=True, exist_ok=True)
        n1 = pack(target, [big], args.out / "fi1.tar.xz")
        n2 = pack(target, sorted(keep - {big}), args.out / "fi2.tar.xz")
    print(f"fi1.tar.xz {n1 / 2**20:.1f} MiB ({big.relative_to(target)}), "
          f"fi2.tar.xz {n2 / 2**20:.1f} MiB ({len(keep) - 1} files; {len(names)} traced at import)")
    if max(n1, n2) > LIMIT:
        raise SystemExit(f"flashinfer_carry: an archive is over {LIMIT // 2**20} MiB: it will not fit a carry")


if __name__ == "__main__":
    main()
