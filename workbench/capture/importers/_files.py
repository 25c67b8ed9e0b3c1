"""Helpers shared by the file-based importers: safe walking, safe loading, skip bookkeeping."""

from __future__ import annotations

import math
import os
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.capture.format import NUMPY_TO_NAME, TORCH_TO_NAME
from workbench.errors import CaptureError, ImporterError, UnsafeFileError, UnsafePathError

ON_ERROR = ("raise", "skip")


def check_on_error(on_error: str) -> str:
    if on_error not in ON_ERROR:
        raise ImporterError(f"on_error must be one of {list(ON_ERROR)}, got {on_error!r}", key="on_error",
                            fix="pass on_error='raise' (stop at the first bad file) or 'skip' (list them "
                                "in the capture's run metadata)")
    return on_error


class Skips:
    """Collects the files an importer skipped (``on_error="skip"``) or raises (``"raise"``)."""

    def __init__(self, on_error: str, root: Path) -> None:
        self.on_error = check_on_error(on_error)
        self.root = root
        self.items: list[dict] = []

    def __call__(self, err: CaptureError) -> None:
        if self.on_error == "raise":
            raise err
        f = err.file
        try:
            f = Path(f).relative_to(self.root).as_posix() if f else f
        except ValueError:
            pass
        self.items.append({"file": f, "error": type(err).__name__, "reason": err.message})

    def summary(self, limit: int = 200) -> dict:
        return {"count": len(self.items), "files": self.items[:limit], "truncated": len(self.items) > limit}


def check_src(src: str | os.PathLike) -> Path:
    p = Path(src)
    if not p.is_dir():
        raise ImporterError("the dump to import must be a directory" if p.exists() else
                            "the dump to import does not exist", file=p, fix="pass the dump's folder as SRC")
    return p


def walk(root: Path, suffixes: tuple[str, ...] | None, skips: Skips) -> list[tuple[Path, str]]:
    """Regular files under ``root`` (hidden entries skipped) as (path, relative posix path), sorted.

    Symbolic links are followed only if they stay inside ``root``; one that leaves it is an
    UnsafePathError (or skipped).
    """
    real_root = root.resolve()
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for fn in filenames:
            if fn.startswith("."):
                continue
            if suffixes is not None and not fn.endswith(suffixes):
                continue
            p = Path(dirpath) / fn
            rel = p.relative_to(root).as_posix()
            if p.is_symlink():
                target = p.resolve()
                if real_root not in target.parents:
                    skips(UnsafePathError(f"{rel} is a link that leaves the dump directory", file=p,
                                          fix="copy the file into the dump instead of linking it"))
                    continue
            if not p.is_file():
                continue
            out.append((p, rel))
    out.sort(key=lambda pr: natural_key(pr[1]))
    return out


_DIGITS = re.compile(r"(\d+)")


def natural_key(s: str) -> tuple:
    """Sort key that orders embedded numbers numerically (step9 before step10)."""
    return tuple((0, int(t), "") if t.isdigit() else (1, 0, t) for t in _DIGITS.split(s) if t)


def load_pt(path: Path) -> Any:
    """``torch.load(weights_only=True)``: pickled objects are refused, never executed."""
    try:
        return torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UnsafeFileError(
            f"refusing to load a .pt file that holds pickled objects, not only tensors ({first})",
            file=path, fix="re-save it holding only tensors (torch.save(tensor) or a dict of tensors); "
                           "never load dumps from untrusted sources with weights_only=False") from None
    except Exception as e:
        raise ImporterError(f"cannot read .pt file: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                            file=path, fix="the file is truncated or not a torch.save file; re-dump it") from None


def check_tensor(t: Any, path: Path, what: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise UnsafeFileError(f"{what} is a {type(t).__name__}, not a tensor", file=path,
                              fix="dump only tensors, or skip such files with on_error='skip'")
    if t.dtype not in TORCH_TO_NAME:
        raise ImporterError(f"{what} has dtype {t.dtype}, which captures cannot hold", file=path,
                            fix=f"cast it to one of {sorted(str(d) for d in TORCH_TO_NAME)} before dumping")
    return t


def check_array(a: np.ndarray, path: Path, what: str) -> np.ndarray:
    if a.dtype not in NUMPY_TO_NAME:
        raise ImporterError(f"{what} has numpy dtype {a.dtype}, which captures cannot hold", file=path,
                            fix=f"save it as one of {sorted(str(d) for d in NUMPY_TO_NAME)}")
    return a


def scalar_tags(d: dict, exclude: set[str] = frozenset()) -> dict:
    """The str/int/float/bool/None entries of ``d`` (capture tags are scalars); a NaN or Inf
    becomes the string ``"nan"``/``"inf"``/``"-inf"`` (manifests are strict JSON) and text that is
    not valid Unicode is kept with the bad characters escaped."""
    out = {}
    for k, v in d.items():
        if k in exclude or not isinstance(v, (str, int, float, bool, type(None))):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            v = repr(v)
        elif isinstance(v, str):
            v = _valid_text(v)
        out[_valid_text(str(k))] = v
    return out


def _valid_text(s: str) -> str:
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


_RESERVED_TAGS = frozenset({"tensor", "rank", "step", "layer", "op", "name"})


def safe_tags(tags: dict) -> dict:
    """Tags renamed where they would collide with CaptureWriter.add's own arguments."""
    return {(f"tag_{k}" if k in _RESERVED_TAGS else k): v for k, v in tags.items()}
