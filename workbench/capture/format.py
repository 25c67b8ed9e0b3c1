"""Capture format version 1: constants, dtype tables and manifest validation.

See docs/capture-format.md for the specification.
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from collections.abc import Mapping
from typing import Any

import numpy as np

from workbench._atomic import atomic_write_json  # noqa: F401 - re-exported
from workbench.errors import FormatVersionError, IncompleteCaptureError, ManifestError, UnsafePathError

FORMAT_NAME = "workbench-capture"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
KEY_FIELDS = ("rank", "step", "layer", "op", "name")
INDEX_COLUMNS = ("rank", "step", "layer", "op", "name", "seq", "dtype", "shape", "shard", "offset",
                 "nbytes", "tags")

# index dtype name -> (torch dtype attribute, numpy dtype used to map the bytes, safetensors name)
_TABLE: dict[str, tuple[str, np.dtype, str]] = {
    "fp64": ("float64", np.dtype("<f8"), "F64"),
    "fp32": ("float32", np.dtype("<f4"), "F32"),
    "fp16": ("float16", np.dtype("<f2"), "F16"),
    "bf16": ("bfloat16", np.dtype("<u2"), "BF16"),
    "fp8_e4m3": ("float8_e4m3fn", np.dtype("u1"), "F8_E4M3"),
    "fp8_e5m2": ("float8_e5m2", np.dtype("u1"), "F8_E5M2"),
    "int64": ("int64", np.dtype("<i8"), "I64"),
    "int32": ("int32", np.dtype("<i4"), "I32"),
    "int16": ("int16", np.dtype("<i2"), "I16"),
    "int8": ("int8", np.dtype("i1"), "I8"),
    "uint8": ("uint8", np.dtype("u1"), "U8"),
    "bool": ("bool", np.dtype("?"), "BOOL"),
}


class _Dtypes(Mapping):
    """``DTYPES[name] -> (torch dtype, numpy dtype, safetensors name)``; torch is imported at the
    first lookup, not with this module (``workbench inspect`` reads captures without torch)."""

    def __getitem__(self, name: str):
        import torch

        attr, np_dt, st = _TABLE[name]
        return getattr(torch, attr), np_dt, st

    def __contains__(self, name: object) -> bool:
        return name in _TABLE

    def __iter__(self):
        return iter(_TABLE)

    def __len__(self) -> int:
        return len(_TABLE)


DTYPES = _Dtypes()
NUMPY_DTYPES: dict[str, np.dtype] = {k: v[1] for k, v in _TABLE.items()}  # torch-free
SAFETENSORS_TO_NAME = {v[2]: k for k, v in _TABLE.items()}


def __getattr__(name: str):
    if name == "TORCH_TO_NAME":  # torch dtype -> index dtype name (imports torch)
        return {v[0]: k for k, v in DTYPES.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

NUMPY_TO_NAME = {
    np.dtype("float64"): "fp64", np.dtype("float32"): "fp32", np.dtype("float16"): "fp16",
    np.dtype("int64"): "int64", np.dtype("int32"): "int32", np.dtype("int16"): "int16",
    np.dtype("int8"): "int8", np.dtype("uint8"): "uint8", np.dtype("bool"): "bool",
}


MAX_HEADER = 100 << 20  # safetensors' own limit on a header


def read_shard_header(path: Path) -> tuple[int, dict[str, tuple[str, list[int], int, int]], dict]:
    """Parse and check a shard's safetensors header as the safetensors library does.

    Returns ``(data_start, entries, metadata)`` with ``entries[name] = (dtype, shape, start, end)``
    as absolute byte offsets in the file and ``dtype`` a capture dtype name. Raises ShardError
    naming the file for anything the safetensors library would refuse.
    """
    from workbench.errors import ShardError

    def bad(msg):
        return ShardError(f"not a valid safetensors shard: {msg}", file=path,
                          fix="re-copy the shard from the source, or re-capture")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise bad(f"{size} bytes, shorter than the 8-byte header length")
            (hl,) = struct.unpack("<Q", head)
            if hl > MAX_HEADER or 8 + hl > size:
                raise bad(f"header length {hl} exceeds the file ({size} bytes) or the {MAX_HEADER}-byte limit")
            raw = f.read(hl)
    except OSError as e:
        raise ShardError(f"cannot read the shard: {e.strerror}", file=path, fix="check the file") from None
    header = parse_json_strict(raw, bad, "header ")
    if not isinstance(header, dict):
        raise bad("the header is not a JSON object")
    meta = header.pop("__metadata__", {}) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise bad("__metadata__ must map strings to strings")
    base = 8 + hl
    entries = {}
    spans = []
    fields = {"dtype", "shape", "data_offsets"}
    sizes = {k: v.itemsize for k, v in NUMPY_DTYPES.items()}
    limit = size - base
    for name, e in header.items():
        if type(e) is not dict or len(e) != 3 or e.keys() != fields:
            raise bad(f"entry {name!r} must hold exactly dtype, shape and data_offsets")
        sdt, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        dt = SAFETENSORS_TO_NAME.get(sdt) if type(sdt) is str else None
        if dt is None:
            raise bad(f"entry {name!r} has dtype {sdt!r}, which captures cannot hold")
        if type(shape) is not list:
            raise bad(f"entry {name!r} has shape {shape!r}")
        count = 1
        for d in shape:
            if type(d) is not int or not 0 <= d <= INT_MAX:
                raise bad(f"entry {name!r} has shape {shape!r}")
            count *= d
        if type(offs) is not list or len(offs) != 2:
            raise bad(f"entry {name!r} has data_offsets {offs!r} outside the data ({limit} bytes)")
        o0, o1 = offs
        if type(o0) is not int or type(o1) is not int or not 0 <= o0 <= o1 <= limit:
            raise bad(f"entry {name!r} has data_offsets {offs!r} outside the data ({limit} bytes)")
        if o1 - o0 != count * sizes[dt]:
            raise bad(f"entry {name!r}: data_offsets {offs} hold {o1 - o0} bytes, shape {shape} of "
                      f"{dt} needs {count * sizes[dt]}")
        entries[name] = (dt, shape, base + o0, base + o1)
        spans.append((o0, o1, name))
    spans.sort()
    end = 0
    for a, b, name in spans:  # safetensors requires the entries to tile the data without holes
        if a != end:
            raise bad(f"entry {name!r} starts at {a}, expected {end} (overlap or hole in the data)")
        end = b
    if end != size - base:
        raise bad(f"the entries cover {end} bytes of data, the file holds {size - base}")
    return base, entries, meta


def itemsize(dtype: str) -> int:
    return NUMPY_DTYPES[dtype].itemsize


def numel(shape) -> int:
    return int(math.prod(shape))


def safe_join(root: Path, rel: str, *, what: str) -> Path:
    """``root/rel``, refusing absolute paths, paths that leave ``root`` and ``root`` itself."""
    if not isinstance(rel, str) or not rel or "\x00" in rel or len(rel) > 1024:
        raise ManifestError(f"{what} path must be a non-empty string of at most 1024 characters, got "
                            f"{rel[:60] + '...' if isinstance(rel, str) and len(rel) > 60 else rel!r}",
                            file=root / MANIFEST, fix="repair the manifest or re-capture")
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        raise UnsafePathError(
            f"{what} path {rel!r} leaves the capture directory", file=root / MANIFEST,
            fix="manifest paths must be relative and stay inside the capture; do not open captures "
                "from untrusted sources without checking them",
        )
    try:
        full = (root / p).resolve()
        base = root.resolve()
    except (OSError, RuntimeError) as e:  # a name too long, a symlink loop
        raise ManifestError(f"{what} path {rel[:60]!r} cannot be resolved: {e}", file=root / MANIFEST,
                            fix="repair the manifest or re-capture") from None
    if full == base:
        raise ManifestError(f"{what} path {rel!r} names the capture directory itself, not a shard file",
                            file=root / MANIFEST, fix="repair the manifest or re-capture")
    if base not in full.parents:
        raise UnsafePathError(
            f"{what} path {rel!r} resolves outside the capture directory (symlink?)",
            file=root / MANIFEST, fix="remove the link or copy the shard into the capture",
        )
    return full


def _err(msg: str, root: Path, fix: str = "the manifest is damaged; re-capture or restore it") -> ManifestError:
    return ManifestError(msg, file=root / MANIFEST, fix=fix)


INT_MAX = 2**63 - 1  # every integer of a manifest fits an int64


def _no_duplicates(pairs):
    d = dict(pairs)  # in C; a key seen twice leaves fewer entries than pairs
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateJSONKey(k)
            seen.add(k)
    return d


class _DuplicateJSONKey(ValueError):
    pass


def parse_json_strict(raw: bytes, err, what: str = "") -> Any:
    """JSON with duplicate object keys refused, NaN/Infinity refused and absurd nesting refused;
    ``err(message)`` builds the typed error raised on any of these."""

    def no_constants(c):
        raise ValueError(f"{c} is not JSON")

    try:
        return json.loads(raw, object_pairs_hook=_no_duplicates, parse_constant=no_constants)
    except _DuplicateJSONKey as e:
        raise err(f"duplicate JSON object key {e.args[0]!r} (which value is meant is ambiguous)") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise err(f"malformed {what}JSON: {e}") from None
    except RecursionError:
        raise err(f"{what}JSON nested too deep to be a capture's") from None


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
    if not mpath.is_file():
        raise _err(f"{MANIFEST} is not a regular file", root)
    try:
        raw = mpath.read_bytes()
    except OSError as e:
        raise _err(f"cannot read {MANIFEST}: {e.strerror}", root, fix="check the file's permissions") from None
    m = parse_json_strict(raw, lambda msg: _err(msg, root), "manifest ")
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
    seen: set[str] = set()
    for i, s in enumerate(m["shards"]):
        if not isinstance(s, dict):
            raise _err(f"shards[{i}] must be an object", root)
        safe_join(root, s.get("path"), what=f"shards[{i}]")
        if s["path"] in seen:
            raise _err(f"shards[{i}].path {s['path']!r} is listed twice", root)
        seen.add(s["path"])
        if type(s.get("bytes")) is not int or not 0 <= s["bytes"] <= INT_MAX:
            raise _err(f"shards[{i}].bytes must be a non-negative int", root)
        sha = s.get("sha256")
        if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
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
    _check_column_types(cols, root, [sh["bytes"] for sh in m["shards"]])
    return m


def _check_column_types(cols: dict, root: Path, shard_bytes: list[int]) -> None:
    # in bulk (map, set and numpy run in C: manifests hold 100k tensors); the first bad entry is
    # then looked for element by element, for the message
    import itertools
    import operator

    nshards = len(shard_bytes)

    def ints(name, lo):
        v = cols[name]
        ok = set(map(type, v)) <= {int}
        if ok and v:
            ok = lo <= min(v) and max(v) <= INT_MAX
        if not ok:
            i, bad = next((i, x) for i, x in enumerate(v) if not (type(x) is int and lo <= x <= INT_MAX))
            raise _err(f"tensors.{name}[{i}] must be an int in [{lo}, 2**63), found {bad!r}", root)

    ints("rank", 0)
    ints("step", 0)
    ints("layer", -1)
    ints("seq", 0)
    ints("offset", 0)
    ints("nbytes", 0)
    ints("shard", 0)
    for name in ("op", "name"):
        if not (set(map(type, cols[name])) <= {str} and all(cols[name])):
            raise _err(f"tensors.{name} must hold non-empty strings", root)
    if cols["shard"] and max(cols["shard"]) >= nshards:
        raise _err(f"tensors.shard refers to shard {max(cols['shard'])} but only {nshards} are listed", root)
    dts, shapes, nbs = cols["dtype"], cols["shape"], cols["nbytes"]
    sizes = {k: v.itemsize for k, v in NUMPY_DTYPES.items()}
    ok = set(map(type, dts)) <= {str} and set(dts) <= set(DTYPES) and set(map(type, shapes)) <= {list}
    if ok and shapes:
        flat = list(itertools.chain.from_iterable(shapes))
        ok = max(map(len, shapes)) <= 64 and set(map(type, flat)) <= {int} and (
            not flat or (min(flat) >= 0 and max(flat) <= INT_MAX))
        if ok:
            need = list(map(operator.mul, map(math.prod, shapes), map(sizes.__getitem__, dts)))
            ok = need == nbs
    if not ok:
        for i, (dt, shp, nb) in enumerate(zip(dts, shapes, nbs)):
            if not isinstance(dt, str) or dt not in DTYPES:
                raise _err(f"tensors.dtype[{i}] is {dt!r}, expected one of {sorted(DTYPES)}", root)
            if not isinstance(shp, list) or len(shp) > 64 or not all(type(d) is int and 0 <= d <= INT_MAX for d in shp):
                raise _err(f"tensors.shape[{i}] must be a list of at most 64 ints in [0, 2**63), got {shp!r}", root)
            if numel(shp) * itemsize(dt) != nb:
                raise _err(f"tensors.nbytes[{i}] = {nb} does not match shape {shp} of {dt} "
                           f"({numel(shp)} x {itemsize(dt)} bytes)", root)
    if not set(map(type, cols["tags"])) <= {dict}:
        raise _err("tensors.tags must hold objects", root)
    seq = np.asarray(cols["seq"], dtype=np.int64)
    if len(seq) and len(np.unique(seq)) != len(seq):
        vals, counts = np.unique(seq, return_counts=True)
        raise _err(f"tensors.seq holds {int(vals[counts > 1][0])} more than once: the causal order is ambiguous", root)
    _check_ranges(cols, root, shard_bytes)


def _check_ranges(cols: dict, root: Path, shard_bytes: list[int]) -> None:
    """Each tensor's bytes lie after the 8-byte length prefix and inside its shard, and no two
    tensors of a shard overlap (vectorised: captures hold 100k tensors)."""
    n = len(cols["shard"])
    if n == 0:
        return
    shard = np.asarray(cols["shard"], dtype=np.int64)
    off = np.asarray(cols["offset"], dtype=np.int64)
    nb = np.asarray(cols["nbytes"], dtype=np.int64)
    size = np.asarray(shard_bytes, dtype=np.int64)[shard]
    # offset + nbytes may not overflow: both < 2**63 and each checked against the shard's size
    bad = (off < 8) | (off > size) | (nb > size - off)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise _err(f"tensors[{i}] (shard {shard[i]}) spans bytes [{off[i]}, {off[i] + nb[i]}) outside the "
                   f"shard's data ({size[i]} bytes)", root)
    order = np.lexsort((off, shard))
    s_sorted, o_sorted, e_sorted = shard[order], off[order], (off + nb)[order]
    nonempty = nb[order] > 0
    same = s_sorted[1:] == s_sorted[:-1]
    clash = same & (o_sorted[1:] < e_sorted[:-1]) & nonempty[1:] & nonempty[:-1]
    if clash.any():
        j = int(np.flatnonzero(clash)[0])
        a, b = int(order[j]), int(order[j + 1])
        raise _err(f"tensors[{a}] and tensors[{b}] overlap in shard {s_sorted[j]} (bytes [{o_sorted[j]}, "
                   f"{e_sorted[j]}) and [{o_sorted[j + 1]}, {e_sorted[j + 1]}))", root)
