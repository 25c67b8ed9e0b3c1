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


def found(r) -> list[dict]:
    """The findings of a run, without the ``skipped`` ones (a backend that cannot run here)."""
    return [f for f in r.findings if "skipped" not in f.get("data", {})]


def skipped(r) -> dict:
    """``{what: reason}`` of the parts a run skipped (nb.skipped)."""
    return {f["data"]["skipped"]: f["data"]["reason"] for f in r.findings if "skipped" in f.get("data", {})}
