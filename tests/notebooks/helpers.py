"""One notebook run for the discovery tests: ``workbench run`` of one notebook, no HTML."""

from __future__ import annotations

from pathlib import Path

from workbench.runner import run_notebooks

ROOT = Path(__file__).resolve().parents[2]


def run_one(out, notebook: str, **params):
    """The NotebookResult of ``notebooks/<notebook>.ipynb`` run with ``params``, reports under ``out``."""
    res = run_notebooks([ROOT / "notebooks" / f"{notebook}.ipynb"], parameters=params, out=out,
                        html_reports=False, log=lambda *a: None)
    (r,) = res.notebooks
    return r


def gates_by_name(r) -> dict:
    return {g["name"]: g for g in r.gates}
