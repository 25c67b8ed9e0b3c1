"""The kernel notebooks run on: this very interpreter, whatever Jupyter has installed."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

from workbench.notebook import CWD_ENV, ROOT_ENV

__all__ = ["KERNEL_NAME", "kernel_env"]

KERNEL_NAME = "workbench-python"


@contextlib.contextmanager
def kernel_env(root: Path):
    """A kernelspec named KERNEL_NAME that runs this very interpreter, visible through a temporary
    JUPYTER_PATH entry, and WORKBENCH_ROOT for the kernel (it inherits the environment)."""
    from workbench.progress import QUIET_ENV

    saved = {k: os.environ.get(k) for k in ("JUPYTER_PATH", ROOT_ENV, CWD_ENV, "PYDEVD_DISABLE_FILE_VALIDATION",
                                            QUIET_ENV)}
    with tempfile.TemporaryDirectory(prefix="workbench-kernel-") as tmp:
        kdir = Path(tmp) / "kernels" / KERNEL_NAME
        kdir.mkdir(parents=True)
        spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": f"workbench ({sys.executable})", "language": "python",
                "metadata": {"debugger": False, "supported_encryption": ["curve"]}}
        (kdir / "kernel.json").write_text(json.dumps(spec, indent=1))
        os.environ["JUPYTER_PATH"] = os.pathsep.join(filter(None, [tmp, saved["JUPYTER_PATH"]]))
        os.environ[ROOT_ENV] = str(root)
        os.environ[CWD_ENV] = os.getcwd()  # relative paths in parameters are the user's, as in any CLI
        os.environ["PYDEVD_DISABLE_FILE_VALIDATION"] = "1"  # frozen-modules warning on stderr
        os.environ[QUIET_ENV] = "1"  # executed notebooks hold results, not progress bars
        try:
            yield KERNEL_NAME
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
