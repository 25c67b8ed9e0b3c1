"""CaptureWriter: stream tensors into a capture directory, commit the manifest last."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench.capture.format import (
    DTYPES, FORMAT_NAME, FORMAT_VERSION, INDEX_COLUMNS, MANIFEST, NUMPY_TO_NAME, TORCH_TO_NAME,
    atomic_write_json,
)
from workbench.errors import CaptureError, DuplicateKeyError

__all__ = ["CaptureWriter", "DEFAULT_SHARD_BYTES"]

DEFAULT_SHARD_BYTES = 256 << 20
_TAG_TYPES = (str, int, float, bool, type(None))


def _as_tensor(x: Any, key: dict) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        t = x.detach()
    elif isinstance(x, np.ndarray):
        if x.dtype not in NUMPY_TO_NAME:
            raise CaptureError(f"unsupported numpy dtype {x.dtype}", key=key,
                               fix=f"convert to one of {sorted(str(d) for d in NUMPY_TO_NAME)}")
        t = torch.from_numpy(np.ascontiguousarray(x))
    else:
        raise CaptureError(f"can only capture tensors or numpy arrays, got {type(x).__name__}", key=key,
                           fix="pass a torch.Tensor or np.ndarray")
    if t.dtype not in TORCH_TO_NAME:
        raise CaptureError(f"unsupported tensor dtype {t.dtype}", key=key,
                           fix=f"cast to one of {sorted(DTYPES)} before capturing")
    if t.is_sparse or t.layout != torch.strided:
        t = t.to_dense()
    # copy now: the model may overwrite this buffer in place after the hook returns
    return t.to("cpu", copy=True).contiguous()


def _check_key(rank, step, layer, op, name) -> dict:
    key = dict(rank=rank, step=step, layer=layer, op=op, name=name)
    for f, lo in (("rank", 0), ("step", 0), ("layer", -1)):
        v = key[f]
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
            raise CaptureError(f"{f} must be an int >= {lo}, got {v!r}", key=key,
                               fix=f"pass {f}= an integer >= {lo}")
        key[f] = int(v)
    for f in ("op", "name"):
        if not isinstance(key[f], str) or not key[f]:
            raise CaptureError(f"{f} must be a non-empty string, got {key[f]!r}", key=key,
                               fix=f"pass {f}='...'")
    return key


class CaptureWriter:
    """Write a capture: safetensors shards streamed as tensors arrive, manifest written last.

    Parameters
    ----------
    path: directory to create (must not exist, or be empty; ``overwrite=True`` replaces an
        existing capture)
    arm: name of the arm ("control", "candidate", ...)
    run: free run metadata (model, commit, engine, policy, env, description, ...), JSON-able
    shard_bytes: a shard is written out once this many bytes are buffered (memory bound)

    Example
    -------
    >>> with CaptureWriter("/tmp/cap", arm="control", run={"model": "toy"}) as w:  # doctest: +SKIP
    ...     w.add(hidden, step=0, layer=3, op="mlp", name="output")
    """

    def __init__(self, path: str | os.PathLike, *, arm: str, run: dict | None = None,
                 shard_bytes: int = DEFAULT_SHARD_BYTES, overwrite: bool = False) -> None:
        self.path = Path(path)
        if not isinstance(arm, str) or not arm:
            raise CaptureError(f"arm must be a non-empty string, got {arm!r}", file=self.path,
                               fix="pass arm='control' (or another name)")
        run = dict(run or {})
        try:
            json.dumps(run, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise CaptureError(f"run metadata must be JSON-serializable: {e}", file=self.path,
                               fix="pass only strings, numbers, bools, lists and dicts in run=") from None
        self.arm = arm
        self.run = run
        self.shard_bytes = int(shard_bytes)
        if self.path.exists():
            if not self.path.is_dir():
                raise CaptureError("capture path exists and is a file", file=self.path,
                                   fix="choose another path")
            if any(self.path.iterdir()):
                if not overwrite:
                    raise CaptureError("capture directory exists and is not empty", file=self.path,
                                       fix="choose a new path or pass overwrite=True to replace it")
                self._clear_existing()
        self.path.mkdir(parents=True, exist_ok=True)
        self._cols: dict[str, list] = {c: [] for c in INDEX_COLUMNS}
        self._keys: set[tuple] = set()
        self._buffer: list[tuple[str, torch.Tensor]] = []
        self._buffered = 0
        self._shards: list[dict] = []
        self._written = 0
        self._seq = 0
        self._closed = False

    def _clear_existing(self) -> None:
        entries = list(self.path.iterdir())
        ours = all(p.name == MANIFEST or p.suffix in (".safetensors", ".tmp") or p.name.startswith(".")
                   for p in entries)
        if not ours:
            raise CaptureError("refusing to overwrite a directory that does not look like a capture",
                               file=self.path, fix="remove it yourself or choose another path")
        (self.path / MANIFEST).unlink(missing_ok=True)  # first: the old capture is now incomplete
        for p in entries:
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)

    # -- public API ----------------------------------------------------------------------------
    @property
    def bytes_written(self) -> int:
        """Tensor bytes accepted so far (written or buffered)."""
        return self._written + self._buffered

    def __len__(self) -> int:
        return self._seq

    def add(self, tensor, *, rank: int = 0, step: int = 0, layer: int = -1, op: str, name: str,
            **tags) -> int:
        """Add one tensor under key (rank, step, layer, op, name); returns its ``seq``.

        ``seq`` is the order of ``add`` calls: the causal order in which tensors were produced.
        Tags are free-form scalars (str, int, float, bool, None).
        """
        if self._closed:
            raise CaptureError("writer is closed", file=self.path, fix="open a new CaptureWriter")
        key = _check_key(rank, step, layer, op, name)
        for k, v in tags.items():
            if not isinstance(v, _TAG_TYPES):
                raise CaptureError(f"tag {k!r} must be a str/int/float/bool/None, got {type(v).__name__}",
                                   key=key, fix="convert the tag to a scalar")
        kt = tuple(key.values())
        if kt in self._keys:
            raise DuplicateKeyError("a tensor with this key was already added", file=self.path, key=key,
                                    fix="give it a distinct name, step or layer (or a suffix such as name='output.1')")
        t = _as_tensor(tensor, key)
        nbytes = t.numel() * t.element_size()
        seq = self._seq
        self._keys.add(kt)
        cols = self._cols
        for f, v in key.items():
            cols[f].append(v)
        cols["seq"].append(seq)
        cols["dtype"].append(TORCH_TO_NAME[t.dtype])
        cols["shape"].append(list(t.shape))
        cols["shard"].append(-1)
        cols["offset"].append(-1)
        cols["nbytes"].append(nbytes)
        cols["tags"].append(dict(tags))
        self._buffer.append((f"t{seq}", t))
        self._buffered += nbytes
        self._seq += 1
        if self._buffered >= self.shard_bytes:
            self._flush()
        return seq

    def close(self) -> Path:
        """Write the last shard and commit the manifest (atomically). Returns the capture path."""
        if self._closed:
            return self.path
        self._flush()
        manifest = {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "arm": self.arm,
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "run": self.run,
            "shards": self._shards,
            "count": self._seq,
            "tensors": self._cols,
        }
        atomic_write_json(self.path / MANIFEST, manifest)
        self._closed = True
        return self.path

    def abort(self) -> None:
        """Stop without committing: the directory stays an incomplete capture (no manifest)."""
        self._buffer.clear()
        self._buffered = 0
        self._closed = True

    def __enter__(self) -> "CaptureWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- shards --------------------------------------------------------------------------------
    def _flush(self) -> None:
        if not self._buffer:
            return
        idx = len(self._shards)
        rel = f"shard-{idx:05d}.safetensors"
        header: dict[str, Any] = {"__metadata__": {"format": FORMAT_NAME, "arm": self.arm}}
        off = 0
        for ename, t in self._buffer:
            nb = t.numel() * t.element_size()
            header[ename] = {"dtype": DTYPES[TORCH_TO_NAME[t.dtype]][2], "shape": list(t.shape),
                             "data_offsets": [off, off + nb]}
            off += nb
        hbytes = json.dumps(header, separators=(",", ":")).encode()
        hbytes += b" " * (-(8 + len(hbytes)) % 8)  # data starts 8-byte aligned
        base = 8 + len(hbytes)
        sha = hashlib.sha256()
        final = self.path / rel
        tmp = final.with_suffix(".safetensors.tmp")
        with open(tmp, "wb") as f:
            for chunk in (struct.pack("<Q", len(hbytes)), hbytes):
                f.write(chunk)
                sha.update(chunk)
            for ename, t in self._buffer:
                if t.numel():
                    mv = memoryview(t.reshape(-1).view(torch.uint8).numpy())
                    f.write(mv)
                    sha.update(mv)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        size = final.stat().st_size
        self._shards.append({"path": rel, "bytes": size, "sha256": sha.hexdigest()})
        pos = 0
        start = len(self._cols["shard"]) - len(self._buffer)
        for j, (ename, t) in enumerate(self._buffer):
            self._cols["shard"][start + j] = idx
            self._cols["offset"][start + j] = base + pos
            pos += t.numel() * t.element_size()
        self._written += self._buffered
        self._buffer = []
        self._buffered = 0
