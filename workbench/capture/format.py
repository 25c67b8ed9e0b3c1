"""Capture format version 1: constants, dtype tables and manifest validation.

See docs/capture-format.md for the specification.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.errors import FormatVersionError, IncompleteCaptureError, ManifestError, UnsafePathError

FORMAT_NAME = "workbench-capture"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
KEY_FIELDS = ("rank", "step", "layer", "op", "name")
INDEX_COLUMNS = ("rank", "step", "layer", "op", "name", "seq", "dtype", "shape", "shard", "offset",
                 "nbytes", "tags")

# index dtype name -> (torch dtype, numpy dtype used to map the bytes, safetensors name)
DTYPES: dict[str, tuple[torch.dtype, np.dtype, str]] = {
    "fp64": (torch.float64, np.dtype("<f8"), "F64"),
    "fp32": (torch.float32, np.dtype("<f4"), "F32"),
    "fp16": (torch.float16, np.dtype("<f2"), "F16"),
    "bf16": (torch.bfloat16, np.dtype("<u2"), "BF16"),
    "fp8_e4m3": (torch.float8_e4m3fn, np.dtype("u1"), "F8_E4M3"),
    "fp8_e5m2": (torch.float8_e5m2, np.dtype("u1"), "F8_E5M2"),
    "int64": (torch.int64, np.dtype("<i8"), "I64"),
    "int32": (torch.int32, np.dtype("<i4"), "I32"),
    "int16": (torch.int16, np.dtype("<i2"), "I16"),
    "int8": (torch.int8, np.dtype("i1"), "I8"),
    "uint8": (torch.uint8, np.dtype("u1"), "U8"),
    "bool": (torch.bool, np.dtype("?"), "BOOL"),
}
TORCH_TO_NAME = {v[0]: k for k, v in DTYPES.items()}
SAFETENSORS_TO_NAME = {v[2]: k for k, v in DTYPES.items()}
NUMPY_TO_NAME = {
    np.dtype("float64"): "fp64", np.dtype("float32"): "fp32", np.dtype("float16"): "fp16",
    np.dtype("int64"): "int64", np.dtype("int32"): "int32", np.dtype("int16"): "int16",
    np.dtype("int8"): "int8", np.dtype("uint8"): "uint8", np.dtype("bool"): "bool",
}


def itemsize(dtype: str) -> int:
    return DTYPES[dtype][1].itemsize


def numel(shape) -> int:
    return int(math.prod(shape))


def safe_join(root: Path, rel: str, *, what: str) -> Path:
    """``root/rel``, refusing absolute paths and paths that leave ``root``."""
    if not isinstance(rel, str) or not rel or "\x00" in rel:
        raise ManifestError(f"{what} path must be a non-empty string, got {rel!r}", file=root / MANIFEST,
                            fix="repair the manifest or re-capture")
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        raise UnsafePathError(
            f"{what} path {rel!r} leaves the capture directory", file=root / MANIFEST,
            fix="manifest paths must be relative and stay inside the capture; do not open captures "
                "from untrusted sources without checking them",
        )
    full = (root / p).resolve()
    if root.resolve() not in full.parents and full != root.resolve():
        raise UnsafePathError(
            f"{what} path {rel!r} resolves outside the capture directory (symlink?)",
            file=root / MANIFEST, fix="remove the link or copy the shard into the capture",
        )
    return full


def atomic_write_json(path: Path, obj: Any) -> None:
    """Write JSON to ``path`` through a temp file, fsync and rename (readers never see half)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, separators=(",", ":"), allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _err(msg: str, root: Path, fix: str = "the manifest is damaged; re-capture or restore it") -> ManifestError:
    return ManifestError(msg, file=root / MANIFEST, fix=fix)


def load_manifest(root: Path) -> dict:
    """Read and validate ``root/manifest.json``; return it with the index columns checked."""
    root = Path(root)
    if not root.exists():
        raise IncompleteCaptureError(f"capture directory does not exist", file=root,
                                     fix="check the path")
    if not root.is_dir():
        raise IncompleteCaptureError("a capture is a directory, got a file", file=root,
                                     fix="pass the capture directory (the one holding manifest.json)")
    mpath = root / MANIFEST
    if not mpath.exists():
        shards = sorted(p.name for p in root.glob("*.safetensors"))
        hint = f" ({len(shards)} shard file(s) present)" if shards else ""
        raise IncompleteCaptureError(
            f"incomplete capture: no {MANIFEST}{hint}", file=root,
            fix="the writer did not finish (crash or exception inside the block); re-run the capture, "
                "or import a foreign dump with `workbench import`",
        )
    try:
        raw = mpath.read_bytes()
        m = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _err(f"malformed manifest JSON: {e}", root) from None
    if not isinstance(m, dict):
        raise _err(f"manifest must be a JSON object, got {type(m).__name__}", root)
    if m.get("format") != FORMAT_NAME:
        raise FormatVersionError(
            f"not a workbench capture: format is {m.get('format')!r}, expected {FORMAT_NAME!r}",
            file=mpath, fix="import foreign dumps with `workbench import KIND SRC DST`",
        )
    ver = m.get("version")
    if not isinstance(ver, int) or isinstance(ver, bool) or ver != FORMAT_VERSION:
        raise FormatVersionError(
            f"unsupported capture format version {ver!r}; this workbench reads version {FORMAT_VERSION}",
            file=mpath, fix="upgrade the workbench (pip install -U workbench) or re-capture",
        )
    for fld, typ in (("arm", str), ("run", dict), ("shards", list), ("tensors", dict)):
        if not isinstance(m.get(fld), typ):
            raise _err(f"manifest field {fld!r} must be a {typ.__name__}, got {type(m.get(fld)).__name__}", root)
    for i, s in enumerate(m["shards"]):
        if not isinstance(s, dict):
            raise _err(f"shards[{i}] must be an object", root)
        safe_join(root, s.get("path"), what=f"shards[{i}]")
        if not isinstance(s.get("bytes"), int) or s["bytes"] < 0:
            raise _err(f"shards[{i}].bytes must be a non-negative int", root)
        sha = s.get("sha256")
        if not isinstance(sha, str) or len(sha) != 64:
            raise _err(f"shards[{i}].sha256 must be a 64-character hex string", root)
    t = m["tensors"]
    cols = {}
    n = None
    for c in INDEX_COLUMNS:
        v = t.get(c)
        if not isinstance(v, list):
            raise _err(f"tensors.{c} must be a list", root)
        if n is None:
            n = len(v)
        elif len(v) != n:
            raise _err(f"tensors.{c} has {len(v)} entries, tensors.rank has {n}", root)
        cols[c] = v
    _check_column_types(cols, root, len(m["shards"]))
    return m


def _check_column_types(cols: dict, root: Path, nshards: int) -> None:
    def ints(name, lo):
        v = cols[name]
        if not all(type(x) is int and x >= lo for x in v):
            bad = next(x for x in v if not (type(x) is int and x >= lo))
            raise _err(f"tensors.{name} must hold ints >= {lo}, found {bad!r}", root)

    ints("rank", 0)
    ints("step", 0)
    ints("layer", -1)
    ints("seq", 0)
    ints("offset", 0)
    ints("nbytes", 0)
    ints("shard", 0)
    for name in ("op", "name"):
        if not all(isinstance(x, str) and x for x in cols[name]):
            raise _err(f"tensors.{name} must hold non-empty strings", root)
    if cols["shard"] and max(cols["shard"]) >= nshards:
        raise _err(f"tensors.shard refers to shard {max(cols['shard'])} but only {nshards} are listed", root)
    for i, (dt, shp, nb) in enumerate(zip(cols["dtype"], cols["shape"], cols["nbytes"])):
        if not isinstance(dt, str) or dt not in DTYPES:
            raise _err(f"tensors.dtype[{i}] is {dt!r}, expected one of {sorted(DTYPES)}", root)
        if not isinstance(shp, list) or not all(type(d) is int and d >= 0 for d in shp):
            raise _err(f"tensors.shape[{i}] must be a list of non-negative ints, got {shp!r}", root)
        if numel(shp) * itemsize(dt) != nb:
            raise _err(f"tensors.nbytes[{i}] = {nb} does not match shape {shp} of {dt}", root)
    if not all(isinstance(x, dict) for x in cols["tags"]):
        raise _err("tensors.tags must hold objects", root)
