"""pyproject.toml and environment.yml name the same dependencies; entry points resolve."""

import re
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"pytorch": "torch"}


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_yml_matches_pyproject():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = {_name(r) for r in py["dependencies"] + py["optional-dependencies"]["dev"]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    have = set()
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            have |= {_name(r) for r in dep["pip"] if not r.startswith("-")}
        else:
            n = _name(dep)
            if n not in ("python", "pip"):
                have.add(CONDA_NAMES.get(n, n))
    assert have == want, f"only in environment.yml: {have - want}; only in pyproject: {want - have}"


def test_user_named_dependencies_are_declared():
    py = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {_name(r) for r in py["dependencies"]}
    assert {"jupyterlab", "ipywidgets", "torch", "numba", "plotly", "papermill", "xarray"} <= names
    assert py["scripts"]["workbench"] == "workbench.cli:main"


def test_importer_entry_points_resolve():
    eps = {ep.name: ep for ep in entry_points(group="workbench.importers")}
    assert {"sglang", "folder"} <= set(eps)
    from workbench.capture.importers.base import Importer
    from workbench.capture.importers.folder import FolderImporter
    from workbench.capture.importers.sglang import SGLangImporter

    assert eps["sglang"].load() is SGLangImporter and eps["folder"].load() is FolderImporter
    for ep in eps.values():
        cls = ep.load()
        assert isinstance(cls, type) and issubclass(cls, Importer) and cls.name == ep.name


def test_import_workbench_is_lazy():
    # `import workbench` (and its errors) must not pull in torch, numba or pandas: the CLI's
    # --help and every plugin listing start from it
    import subprocess
    import sys

    code = ("import sys, workbench, workbench.errors, workbench.cli; "
            "heavy = [m for m in ('torch', 'numba', 'pandas', 'xarray') if m in sys.modules]; "
            "print(heavy); sys.exit(1 if heavy else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, f"imported eagerly: {p.stdout} {p.stderr[-500:]}"
