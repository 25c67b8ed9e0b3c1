"""Regenerate the bundled captures portably and compare them, tensor by tensor, with captures/.

Run on another machine (another CPU vendor, another torch) to check docs/portability.md's claim:

    python scripts/check_portable_samples.py --out /tmp/samples

Prints, per capture, how many tensors differ from the committed ones and the first that does, and
the machine's CPU, torch version and what run["arithmetic"] recorded; exits 1 if any differ.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/wb-portable-samples")
    ap.add_argument("--against", default=str(ROOT / "captures"))
    a = ap.parse_args()
    import torch

    from workbench.capture import open_capture
    from workbench.models.sample import write_samples
    from workbench.numerics.portable import cpu_name

    paths = write_samples(a.out, overwrite=True)
    flags = sorted({f for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
                    for f in line.split() if f.startswith("avx512f") or f == "avx2"})
    print(f"cpu: {cpu_name()} ({', '.join(flags)}); torch {torch.__version__}")
    total = 0
    for p in paths:
        new, old = open_capture(p), open_capture(Path(a.against) / p.name)
        diff, first = 0, None
        for (k, x), (_, y) in zip(new, old):
            if x.dtype != y.dtype or x.shape != y.shape or not torch.equal(x, y):
                diff += 1
                first = first or k
        if new.keys() != old.keys():
            diff += 1
            first = first or "key index differs"
        total += diff
        print(f"{p.name:26s} {diff:5d} of {len(old)} tensors differ" + (f"; first {first}" if first else ""))
    print("arithmetic:", open_capture(paths[0]).run.get("arithmetic"))
    print("TOTAL differing tensors:", total)
    return 1 if total else 0


if __name__ == "__main__":
    raise SystemExit(main())
