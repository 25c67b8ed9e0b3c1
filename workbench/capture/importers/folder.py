"""Import a folder of .pt / .npy / .npz / .safetensors files named by a user-given pattern.

Pattern
-------
A relative path with ``/`` separators, matched against each tensor file's path under SRC::

    rank{rank}/step{step}/{op}.{layer}.{name}.pt
    dump_{step}/**/{op}__{name}.npy

* ``{rank}``, ``{step}``: non-negative integers; ``{layer}``: an integer (-1 allowed);
* ``{op}``, ``{name}`` and any other ``{field}``: text without ``/`` (other fields become tags);
  a text field takes the shortest text that lets the rest match, so
  ``{op}.{layer}.{name}.pt`` reads ``self_attn.o_proj.3.output.pt`` as op ``self_attn.o_proj``;
* a field named twice must have the same value both times;
* ``*`` or ``{*}``: any text within one folder level; ``**``: any text across levels;
* ``{{`` and ``}}``: literal braces; everything else is literal (``.`` is a dot).

Missing fields default to rank 0, step 0, layer -1, op ``tensor`` and name ``value``. Absolute
patterns and ``..`` are refused (UnsafePathError). A tensor file that does not match is a
FileNameError, or is skipped and listed in the run metadata with ``on_error="skip"``. Files of
other types are ignored.

Contents
--------
``.npy``: one array (``allow_pickle=False``: object arrays are refused). ``.pt``: a tensor, a
dict or list of tensors, or SGLang's ``{"value": tensor, "meta": {...}}``, loaded with
``torch.load(weights_only=True)``; anything else is an UnsafeFileError. ``.npz``,
``.safetensors`` and ``.pt`` dicts/lists hold several arrays: each becomes a tensor whose name is
the array's key (``a.b`` for nested dicts) when the pattern has no ``{name}``, the pattern's name
when the file holds a single array, else ``<name>.<key>``; the key is also kept as tag ``array``.

Causal order (seq)
------------------
Files sorted by step, then by path with numbers compared as numbers (``step9`` before
``step10``); ``order="mtime"`` sorts by step, then modification time. Arrays of one file follow in
the order the file lists them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from workbench.capture.importers._files import (
    Skips, check_array, check_src, check_tensor, load_pt, natural_key, safe_tags, scalar_tags, walk,
)
from workbench.capture.importers.base import Importer
from workbench.capture.writer import CaptureWriter
from workbench.errors import DuplicateKeyError, FileNameError, ImporterError, UnsafeFileError, UnsafePathError

__all__ = ["FolderImporter", "compile_pattern", "match_path", "SUFFIXES"]

SUFFIXES = (".pt", ".npy", ".npz", ".safetensors")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_FIELD_RE = {"rank": r"[0-9]+", "step": r"[0-9]+", "layer": r"-?[0-9]+"}
_INT_FIELDS = ("rank", "step", "layer")
DEFAULTS = {"rank": 0, "step": 0, "layer": -1, "op": "tensor", "name": "value"}
ORDERS = ("path", "mtime")


def _pattern_error(pattern: str, why: str) -> ImporterError:
    return ImporterError(f"invalid pattern {pattern!r}: {why}", key="pattern",
                         fix="write e.g. 'rank{rank}/step{step}/{op}.{layer}.{name}.pt'; fields are "
                             "{identifier}, wildcards * and **, literal braces {{ and }}")


def compile_pattern(pattern: str) -> tuple[re.Pattern, tuple[str, ...]]:
    """A compiled regex (full match over a relative posix path) and the pattern's field names.

    Literal text is escaped; raises ImporterError on a malformed pattern and UnsafePathError on an
    absolute pattern or one with ``..``.
    """
    if not isinstance(pattern, str) or not pattern.strip():
        raise _pattern_error(str(pattern), "the pattern is empty")
    if "\x00" in pattern or "\\" in pattern:
        raise _pattern_error(pattern, "use '/' as the separator (no backslashes or NUL)")
    if pattern.startswith("/") or re.match(r"[A-Za-z]:", pattern) or ".." in pattern.split("/"):
        raise UnsafePathError(f"pattern {pattern!r} leaves the dump directory", key="pattern",
                              fix="the pattern is relative to SRC: drop leading '/' and any '..'")
    out: list[str] = []
    fields: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if pattern.startswith("{{", i):
            out.append(re.escape("{"))
            i += 2
        elif pattern.startswith("}}", i):
            out.append(re.escape("}"))
            i += 2
        elif c == "{":
            j = pattern.find("}", i)
            if j < 0:
                raise _pattern_error(pattern, f"unclosed '{{' at position {i}")
            field = pattern[i + 1:j]
            if field == "*":
                out.append("[^/]*")
            elif not _IDENT.fullmatch(field):
                raise _pattern_error(pattern, f"{{{field}}} is not a field name (an identifier) or {{*}}")
            elif field in fields:
                out.append(f"(?P={field})")
            else:
                fields.append(field)
                out.append(f"(?P<{field}>{_FIELD_RE.get(field, '[^/]+?')})")
            i = j + 1
        elif c == "}":
            raise _pattern_error(pattern, f"unmatched '}}' at position {i} (write '}}}}' for a literal brace)")
        elif pattern.startswith("**/", i):
            out.append("(?:[^/]+/)*")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        else:
            out.append(re.escape(c))
            i += 1
    try:
        return re.compile("".join(out), re.DOTALL), tuple(fields)
    except re.error as e:  # pragma: no cover - every piece above is escaped or well formed
        raise _pattern_error(pattern, str(e)) from None


def match_path(regex: re.Pattern, fields: tuple[str, ...], rel: str, *, file=None) -> dict[str, Any]:
    """Field values of ``rel`` (ints for rank/step/layer); FileNameError if it does not match."""
    m = regex.fullmatch(rel)
    if m is None:
        raise FileNameError(f"path {rel!r} does not match the pattern", file=file or rel,
                            fix="fix the pattern (see docs/capturing.md), or pass on_error='skip' to "
                                "skip files that do not match")
    vals: dict[str, Any] = {}
    for f in fields:
        v = m.group(f)
        vals[f] = int(v) if f in _INT_FIELDS else v
    return vals


def _flatten(obj: Any, path: Path, prefix: str = "", depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield prefix, check_tensor(obj, path, f"entry {prefix!r}" if prefix else "the file's content")
    elif isinstance(obj, dict) and depth < 4:
        for k, v in obj.items():
            yield from _flatten(v, path, f"{prefix}.{k}" if prefix else str(k), depth + 1)
    elif isinstance(obj, (list, tuple)) and depth < 4:
        for i, v in enumerate(obj):
            yield from _flatten(v, path, f"{prefix}.{i}" if prefix else str(i), depth + 1)
    else:
        where = f"entry {prefix!r}" if prefix else "the file's content"
        raise UnsafeFileError(f"{where} is a {type(obj).__name__}, not a tensor", file=path,
                              fix="store only tensors (or dicts/lists of tensors), or skip the file with "
                                  "on_error='skip'")


def read_arrays(path: Path) -> tuple[list[tuple[str | None, Any]], dict]:
    """[(key or None for a single array, tensor or ndarray)], plus scalar meta tags."""
    suffix = path.suffix
    if suffix == ".npy":
        try:
            a = np.load(path, allow_pickle=False)
        except ValueError as e:
            if "pickle" in str(e) or "object" in str(e).lower():
                raise UnsafeFileError("refusing a .npy file holding Python objects", file=path,
                                      fix="save numeric arrays only (np.save with a numeric dtype)") from None
            raise ImporterError(f"cannot read .npy: {e}", file=path, fix="the file is damaged; re-dump it") from None
        except Exception as e:
            raise ImporterError(f"cannot read .npy: {type(e).__name__}: {e}", file=path,
                                fix="the file is damaged; re-dump it") from None
        return [(None, check_array(a, path, "the array"))], {}
    if suffix == ".npz":
        out = []
        try:
            with np.load(path, allow_pickle=False) as z:
                for k in z.files:
                    try:
                        a = z[k]
                    except ValueError as e:
                        raise UnsafeFileError(f"refusing array {k!r}: it holds Python objects ({e})", file=path,
                                              fix="save numeric arrays only") from None
                    if not isinstance(a, np.ndarray):  # numpy hands back a member that is no .npy as bytes
                        what = "a raw pickle" if bytes(a[:1]) == b"\x80" else "data that is not a .npy array"
                        raise UnsafeFileError(f"refusing member {k!r}: it holds {what}", file=path,
                                              fix="save numeric arrays only (np.savez); never unpickle dumps")
                    out.append((k, check_array(a, path, f"array {k!r}")))
        except (UnsafeFileError, ImporterError):
            raise
        except Exception as e:
            raise ImporterError(f"cannot read .npz: {type(e).__name__}: {e}", file=path,
                                fix="the file is damaged; re-dump it") from None
        return out, {}
    if suffix == ".safetensors":
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                out = [(k, check_tensor(f.get_tensor(k), path, f"tensor {k!r}")) for k in f.keys()]
        except (UnsafeFileError, ImporterError):
            raise
        except Exception as e:
            raise ImporterError(f"cannot read .safetensors: {type(e).__name__}: {e}", file=path,
                                fix="the file is damaged; re-dump it") from None
        return out, {}
    obj = load_pt(path)
    if isinstance(obj, torch.Tensor):
        return [(None, check_tensor(obj, path, "the file's content"))], {}
    if isinstance(obj, dict) and set(obj) <= {"value", "meta"} and "value" in obj and isinstance(obj.get("meta", {}), dict):
        return [(None, check_tensor(obj["value"], path, "'value'"))], scalar_tags(obj.get("meta", {}))
    return list(_flatten(obj, path)), {}


class FolderImporter(Importer):
    name = "folder"
    description = "folders of .pt/.npy/.npz/.safetensors files named by a pattern such as rank{rank}/step{step}/{op}.{layer}.{name}.pt"

    def run(self, src: str | os.PathLike, dst: str | os.PathLike, *, pattern: str, arm: str | None = None,
            run: dict | None = None, on_error: str = "raise", order: str = "path",
            overwrite: bool = False) -> Path:
        """Import the files under ``src`` whose relative paths match ``pattern`` into ``dst``.

        Parameters
        ----------
        pattern: e.g. ``"rank{rank}/step{step}/{op}.{layer}.{name}.pt"`` (see the module docstring)
        arm: arm name (default: the folder's name)
        run: extra run metadata; the importer adds ``run["importer"]``
        on_error: "raise" (default) or "skip" (non-matching, unreadable or unsafe files are
            listed under ``run["importer"]["skipped"]``)
        order: "path" (default) or "mtime", after step
        overwrite: replace an existing capture at ``dst``
        """
        root = check_src(src)
        regex, fields = compile_pattern(pattern)
        skips = Skips(on_error, root)
        if order not in ORDERS:
            raise ImporterError(f"order must be one of {list(ORDERS)}, got {order!r}", key="order",
                                fix="pass order='path' or 'mtime'")
        files = walk(root, SUFFIXES, skips)
        entries = []
        for path, rel in files:
            try:
                vals = match_path(regex, fields, rel, file=path)
            except FileNameError as e:
                skips(e)
                continue
            key = {f: vals.get(f, DEFAULTS[f]) for f in DEFAULTS}
            tags = {f: v for f, v in vals.items() if f not in DEFAULTS}
            sort = (key["step"], path.stat().st_mtime_ns if order == "mtime" else 0, natural_key(rel))
            entries.append((sort, path, rel, key, tags))
        if not entries and not skips.items:
            raise ImporterError(f"no {'/'.join(SUFFIXES)} files found", file=root,
                                fix="point SRC at the dump folder")
        entries.sort(key=lambda e: e[0])
        info = {"kind": self.name, "source": str(root.resolve()), "pattern": pattern, "files": len(files),
                "options": {"on_error": on_error, "order": order}}
        meta = dict(run or {})
        imported = 0
        from workbench.progress import progress

        with CaptureWriter(dst, arm=arm or root.resolve().name, run=meta, overwrite=overwrite) as w:
            for _, path, rel, key, tags in progress(entries, desc=f"import {root.name}", unit="file", min_total=50):
                try:
                    arrays, meta_tags = read_arrays(path)
                except (UnsafeFileError, ImporterError) as err:
                    skips(err)
                    continue
                single = len(arrays) == 1
                for akey, arr in arrays:
                    k = dict(key)
                    t = safe_tags({**meta_tags, **tags})
                    if akey is not None:
                        t["array"] = akey
                        if "name" not in fields:
                            k["name"] = akey
                        elif not single:
                            k["name"] = f"{key['name']}.{akey}"
                    try:
                        w.add(arr, **k, **t)
                    except DuplicateKeyError as e:
                        raise DuplicateKeyError(
                            f"{rel} maps to a key that an earlier file already produced", file=path, key=e.key,
                            fix="add the distinguishing part of the path as a field of the pattern "
                                "(e.g. {rank}, {step}, {name})") from None
                    imported += 1
            info.update(imported=imported, skipped=skips.summary())
            meta["importer"] = info
            w.run = meta
        return Path(dst)
