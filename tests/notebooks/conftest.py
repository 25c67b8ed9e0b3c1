"""One papermill run of every notebook per test session, shared by the notebook and browser tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from workbench.runner import find_notebooks, run_notebooks

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = find_notebooks(ROOT)


@pytest.fixture(scope="session")
def suite(tmp_path_factory):
    """``workbench run`` of every notebook with its defaults: the RunResult (reports in .out)."""
    return run_notebooks(NOTEBOOKS, out=tmp_path_factory.mktemp("reports"), log=lambda *_: None)
