"""Cold start of the CLI and of the notebook suite, side by side with their peers in one run.

Each command runs in a fresh process ``--repeats`` times, interleaved (page cache warm after the
first round, which is dropped); reported: the median wall time. Peers: ``python -c pass`` (the
interpreter alone) and ``python -c "import torch"`` (what a command that needs torch pays at
least). ``--notebooks`` also times ``workbench run`` of the whole bundled suite once per ``--jobs`` value
(``--jobs 1,2``: one notebook at a time, then two at once, side by side in the same run).

Usage::

    python benchmarks/cold_start.py [--repeats 5] [--notebooks [--jobs 1,2]] [--json FILE]
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
    ap.add_argument("--jobs", default="1", help="comma-separated `workbench run -j` values, timed side by side "
                    "in this run (e.g. 1,2)")
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
        result["notebook_suite_s"], result["notebook_s"] = {}, {}
        for jobs in [int(j) for j in str(a.jobs).split(",")]:
            with tempfile.TemporaryDirectory() as out:
                t = time.perf_counter()
                subprocess.run([*CLI, "--quiet", "run", "--out", out, "-j", str(jobs)], cwd=ROOT, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                result["notebook_suite_s"][f"-j {jobs}"] = time.perf_counter() - t
                res = json.loads((Path(out) / "results.json").read_text())
                result["notebook_s"][f"-j {jobs}"] = {n["notebook"]: n.get("seconds") for n in res["notebooks"]}
            print(f"workbench run -j {jobs} (every bundled notebook, HTML included): "
                  f"{result['notebook_suite_s'][f'-j {jobs}']:.1f} s")
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
