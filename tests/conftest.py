"""Shared test helpers.

numba's CUDA simulator must be chosen before numba.cuda is first imported, and the PTX compile
tests need the real numba.cuda target, so simulator tests run in a subprocess: use the
``cudasim`` fixture, ``cudasim("package.module:function", arg, ...)``, which calls the function in
a fresh interpreter with NUMBA_ENABLE_CUDASIM=1 and returns its JSON-able result.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run_cudasim(target: str, *args, timeout: float = 600):
    module, _, func = target.partition(":")
    code = textwrap.dedent(f"""
        import importlib, json, sys
        sys.path.insert(0, {str(ROOT)!r})
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        mod = importlib.import_module({module!r})
        out = getattr(mod, {func!r})(*json.loads(sys.argv[1]))
        print("__CUDASIM_RESULT__" + json.dumps(out))
    """)
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(list(args))], env=env,
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise AssertionError(f"cudasim run of {target} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    for line in proc.stdout.splitlines()[::-1]:
        if line.startswith("__CUDASIM_RESULT__"):
            return json.loads(line[len("__CUDASIM_RESULT__"):])
    raise AssertionError(f"cudasim run of {target} printed no result:\n{proc.stdout[-3000:]}")


@pytest.fixture
def cudasim():
    return _run_cudasim


def has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


# The end-to-end tier (`make test-all`, what CI runs): every notebook run and exported (the
# `suite` fixture), the browser, the users' notebook cases, the mutants and the regeneration of the
# bundled captures. `make test` (-m "not slow") leaves it out to stay within 10 minutes here.
def _mark_slow(items) -> None:
    for item in items:
        if "suite" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


def pytest_collection_modifyitems(config, items):
    _mark_slow(items)
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; run on the GPU machine (see ../shared/GPU.md)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# In CI (CI=true) a test may be skipped only for a reason that CI can never meet (no GPU on the
# CI machine, or the GPU-only fla package); a skip for a missing tool the suite needs (a C++
# compiler, nvcc, chromium, playwright, numba.cuda, transformers, ...) fails the run instead of
# hiding the tests behind it.
CI_ALLOWED_SKIPS = ("needs a CUDA GPU", "has a GPU", "fla runs here", "checks the CPU-only behaviour",
                    "could not import 'fla'")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _strict_skip(report) -> None:
    if not (_in_ci() and report.skipped) or getattr(report, "wasxfail", None) is not None:
        return
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(ok in reason for ok in CI_ALLOWED_SKIPS):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped in CI: {reason}\nCI must have every tool the test suite needs; install it "
                       f"in scripts/setup.sh (or, if CI can never have it, list the reason in "
                       f"tests/conftest.py CI_ALLOWED_SKIPS)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _strict_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _strict_skip(outcome.get_result())
