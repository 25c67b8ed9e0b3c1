#!/usr/bin/env python
"""Strip outputs, execution counts and widget state from notebooks (default: notebooks/*.ipynb),
so that they are stored clean; `--check` only reports and exits 1 if any notebook is dirty."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat


def strip(nb) -> bool:
    changed = False
    for c in nb.cells:
        if c.cell_type == "code":
            changed |= bool(c.outputs) or c.execution_count is not None
            c.outputs, c.execution_count = [], None
        for k in ("execution", "papermill", "collapsed", "scrolled"):
            changed |= c.metadata.pop(k, None) is not None
    for k in ("widgets", "papermill"):
        changed |= nb.metadata.pop(k, None) is not None
    return changed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    paths = args.paths or sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))
    dirty = []
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        if strip(nb):
            dirty.append(p)
            if not args.check:
                nbformat.write(nb, p)
    for p in dirty:
        print(f"{'dirty' if args.check else 'stripped'}: {p}")
    return 1 if (args.check and dirty) else 0


if __name__ == "__main__":
    sys.exit(main())
