"""Cold start of the CLI and of the notebook suite, side by side with their peers in one run.

Each command runs in a fresh process ``--repeats`` times, interleaved (page cache warm after the
first round, which is dropped); reported: the median wall time. Peers: ``python -c pass`` (the
interpreter alone) and ``python -c "import torch"`` (what a command that needs torch pays at
least). ``--notebooks`` also times ``workbench run`` of the whole bundled suite once.

Usage::

    python benchmarks/cold_start.py [--repeats 5] [--notebooks] [--json FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "workbench.cli"]
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "python -c 'import workbench'": [sys.executable, "-c", "import workbench"],
    "workbench --help": [*CLI, "--help"],
    "workbench inspect captures/control": [*CLI, "inspect", "captures/control"],
    "workbench compare control candidate": [*CLI, "--quiet", "compare", "captures/control", "captures/candidate",
                                            "--rows", "0"],
}


def _time(cmd: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--notebooks", action="store_true", help="also time `workbench run` of the bundled suite")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    times: dict[str, list[float]] = {k: [] for k in COMMANDS}
    for rnd in range(a.repeats + 1):
        for name, cmd in COMMANDS.items():
            s = _time(cmd)
            if rnd:  # the first round fills the page cache
                times[name].append(s)
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in med.items():
        print(f"{k:<40} {v:7.3f} s  (min {min(times[k]):.3f})")
    result = {"benchmark": "cold_start", "command": "python benchmarks/cold_start.py " + " ".join(argv or sys.argv[1:]),
              "date": dt.date.today().isoformat(),
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
              "versions": {"python": platform.python_version(), **_versions()},
              "repeats": a.repeats, "median_s": med}
    if a.notebooks:
        with tempfile.TemporaryDirectory() as out:
            t = time.perf_counter()
            subprocess.run([*CLI, "--quiet", "run", "--out", out], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            result["notebook_suite_s"] = time.perf_counter() - t
            res = json.loads((Path(out) / "results.json").read_text())
            result["notebook_s"] = {n["notebook"]: n.get("seconds") for n in res["notebooks"]}
        print(f"workbench run (every bundled notebook, HTML included): {result['notebook_suite_s']:.1f} s")
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    return 0


def _versions() -> dict:
    out = {}
    for m in ("torch", "numpy", "papermill"):
        try:
            out[m] = __import__(m).__version__
        except Exception:  # noqa: BLE001
            pass
    return out


if __name__ == "__main__":
    raise SystemExit(main())
