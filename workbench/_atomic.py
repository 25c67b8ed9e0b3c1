"""Atomic file writes (no heavy imports: the CLI and the runner use them before torch loads)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["atomic_write_json", "fsync_dir"]


def fsync_dir(d: Path) -> None:
    """Make a rename in directory ``d`` durable (best effort where the file system refuses)."""
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_json(path: Path, obj: Any, *, indent: int | None = None) -> None:
    """Write JSON to ``path`` through a temp file, fsync and rename (readers never see half)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, separators=(",", ":") if indent is None else (",", ": "), indent=indent,
                      allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
