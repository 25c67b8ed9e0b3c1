"""Portable CPU arithmetic: run torch so that its float results do not depend on the CPU.

torch's CPU results depend on the machine in three ways, each seen on the bundled captures:

- ATen picks kernels by the CPU's vector width (``AVX2``, ``AVX512``): a reduction sums in an
  order set by the vector length, and an elementwise ``exp``/``silu`` runs a vectorised
  implementation on whole vectors but the scalar libm one on the tail, whose length depends on
  the width, so the same element can round differently.
- MKL (torch's BLAS) picks a GEMM code path by CPU vendor, instruction set, thread count and
  operand alignment.
- Parallel reductions split their work by the number of threads.

Inside :func:`portable_env` (a child process: these choices are fixed when torch loads) ATen runs
its baseline kernels (``ATEN_CPU_CAPABILITY=default``, the same machine code on every x86-64 CPU),
MKL runs its conditional-numerical-reproducibility path (``MKL_CBWR=COMPATIBLE``, documented by
Intel to give the same bits on every Intel and compatible CPU), on one thread, with oneDNN and
NNPACK off. What remains is the torch version and the C library's ``libm`` (glibc's ``expf`` and
friends), which :func:`arithmetic` records.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Sequence

__all__ = ["PORTABLE_ENV", "portable_env", "is_portable", "enter_portable", "arithmetic", "run_portable", "cpu_name"]

PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "MKL_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "NUMBA_NUM_THREADS": "1",
}


def portable_env(base: dict | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with :data:`PORTABLE_ENV` set."""
    env = dict(os.environ if base is None else base)
    env.update(PORTABLE_ENV)
    return env


def is_portable() -> tuple[bool, str]:
    """(True, "") when this process computes portably, else (False, what differs)."""
    import torch

    bad = [f"{k}={os.environ.get(k)!r} (want {v!r})" for k, v in PORTABLE_ENV.items()
           if os.environ.get(k) != v]
    cap = torch.backends.cpu.get_cpu_capability()
    if cap != "DEFAULT":
        bad.append(f"ATen CPU capability {cap} (want DEFAULT: set ATEN_CPU_CAPABILITY before torch loads)")
    return (not bad, "; ".join(bad))


def enter_portable() -> None:
    """Finish the set-up that only the running process can do (threads, oneDNN, NNPACK); raises
    WorkbenchError if the environment was not set before torch loaded."""
    import torch

    from workbench.errors import WorkbenchError

    ok, why = is_portable()
    if not ok:
        raise WorkbenchError(f"this process does not compute portably: {why}", key="environment",
                             fix="run it through workbench.numerics.portable.run_portable (a child process "
                                 "started with portable_env())")
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    torch.backends.nnpack.set_flags(False)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), for benchmark and portability records."""
    import platform
    from pathlib import Path

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def arithmetic() -> dict[str, Any]:
    """What float results computed here depend on (recorded in the bundled captures)."""
    import platform

    import torch

    return {"torch": torch.__version__.split("+")[0], "aten_cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": os.environ.get("MKL_CBWR"), "threads": torch.get_num_threads(),
            "libc": "-".join(platform.libc_ver()), "machine": platform.machine()}


def run_portable(module: str, args: Sequence[str], *, parallel: Sequence[Sequence[str]] | None = None) -> None:
    """Run ``python -m module args`` in a child process with :func:`portable_env`; raise
    WorkbenchError (with the child's last output lines) if it fails. ``parallel``: several
    argument lists, run as that many children at once (each single-threaded, as the portable
    arithmetic requires), all of which must succeed."""
    from workbench.errors import WorkbenchError

    runs = [list(a) for a in parallel] if parallel else [list(args)]
    procs = [subprocess.Popen([sys.executable, "-m", module, *a], env=portable_env(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for a in runs]
    outs = [p.communicate()[0] for p in procs]
    for p, out in zip(procs, outs):
        if p.returncode != 0:
            tail = "\n".join(out.strip().splitlines()[-15:])
            raise WorkbenchError(f"`python -m {module}` failed with exit code {p.returncode}:\n{tail}",
                                 key=module, fix="run the command yourself to see the whole output")
