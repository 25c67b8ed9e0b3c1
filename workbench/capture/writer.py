"""CaptureWriter: stream tensors into a capture directory, commit the manifest last."""

from __future__ import annotations

import ctypes
import datetime as _dt
import errno
import fcntl
import hashlib
import json
import math
import os
import secrets
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workbench._atomic import fsync_dir
from workbench.capture.format import (
    DTYPES, FORMAT_NAME, FORMAT_VERSION, INDEX_COLUMNS, INT_MAX, KEY_FIELDS, MANIFEST, NUMPY_TO_NAME,
    TORCH_TO_NAME, atomic_write_json, load_manifest,
)
from workbench.errors import (CaptureError, CaptureLockedError, DiskFullError, DuplicateKeyError,
                              IncompleteCaptureError)

__all__ = ["CaptureWriter", "DEFAULT_SHARD_BYTES", "MARKER", "is_workbench_capture"]

DEFAULT_SHARD_BYTES = 256 << 20
_TAG_TYPES = (str, int, float, bool, type(None))
# written first into every directory a CaptureWriter fills: an incomplete capture (no manifest)
# that holds it was written by the workbench and may be overwritten; nothing else may
MARKER = ".workbench-writer"
_STAGING = ".wb-staging-"
_OLD = ".wb-old-"


def _text_ok(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_tag(k: str, v, key: dict) -> None:
    if not isinstance(v, _TAG_TYPES):
        raise CaptureError(f"tag {k!r} must be a str/int/float/bool/None, got {type(v).__name__}",
                           key=key, fix="convert the tag to a scalar")
    if isinstance(v, float) and not math.isfinite(v):
        raise CaptureError(f"tag {k!r} is {v!r}: manifests are strict JSON and hold no NaN or Inf",
                           key=key, fix=f"store it as a string ({k}=str(value)) or leave the tag out")
    if not _text_ok(k) or (isinstance(v, str) and not _text_ok(v)):
        raise CaptureError(f"tag {k!r} holds text that is not valid Unicode (a lone surrogate)", key=key,
                           fix="pass text that encodes to UTF-8 (e.g. decode bytes with errors='replace')")


def is_workbench_capture(path: Path) -> tuple[bool, str]:
    """(True, "") when ``path`` holds only a workbench capture (a valid manifest and the files it
    lists, or an incomplete capture a CaptureWriter left), else (False, what is there)."""
    entries = sorted(p.name for p in path.iterdir())
    shown = ", ".join(entries[:8]) + (f", ... ({len(entries)} entries)" if len(entries) > 8 else "")
    try:
        m = load_manifest(path)
    except IncompleteCaptureError:
        if MARKER not in entries:
            return False, f"it holds {shown} and no {MANIFEST} or {MARKER} (not written by a CaptureWriter)"
        allowed = None  # an unfinished capture of ours: shards, temporaries
    except CaptureError as e:
        return False, f"its {MANIFEST} is not a valid capture manifest ({e.message})"
    else:
        allowed = {MANIFEST} | {Path(sh["path"]).parts[0] for sh in m["shards"]}
    for name in entries:
        if name == MARKER or name.endswith(".tmp"):
            continue
        if allowed is None and name.endswith(".safetensors") and (path / name).is_file():
            continue
        if allowed is not None and name in allowed:
            continue
        return False, f"it holds {name!r}, which is not part of the capture ({shown})"
    return True, ""


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directories in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    rc = fn(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), str(a))


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
    if t.device.type == "meta":
        raise CaptureError("a meta-device tensor has no data to capture", key=key,
                           fix="capture real tensors (run the model on cpu/cuda, not on the meta device)")
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
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo or v > INT_MAX:
            raise CaptureError(f"{f} must be an int >= {lo} (and < 2**63), got {v!r}", key=key,
                               fix=f"pass {f}= an integer >= {lo}")
        key[f] = int(v)
    for f in ("op", "name"):
        if not isinstance(key[f], str) or not key[f]:
            raise CaptureError(f"{f} must be a non-empty string, got {key[f]!r}", key=key,
                               fix=f"pass {f}='...'")
        if not _text_ok(key[f]):
            raise CaptureError(f"{f} {key[f]!r} is not valid Unicode (a lone surrogate)", key=key,
                               fix=f"pass {f}= text that encodes to UTF-8")
    return key


def _open_shard(path: Path):
    return open(path, "wb")


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
        if not isinstance(arm, str) or not arm or not _text_ok(arm):
            raise CaptureError(f"arm must be a non-empty string, got {arm!r}", file=self.path,
                               fix="pass arm='control' (or another name)")
        run = dict(run or {})
        try:
            json.dumps(run, allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise CaptureError(f"run metadata must be JSON-serializable: {e}", file=self.path,
                               fix="pass only strings, numbers (finite), bools, lists and dicts in run=") from None
        self.arm = arm
        self.run = run
        self.shard_bytes = int(shard_bytes)
        self._closed = True  # until set up: a failed constructor leaves nothing to abort
        self._lock_fd: int | None = None
        self._abs = Path(os.path.abspath(self.path))  # lock, staging and swap live beside it
        self._lock_path = self._abs.parent / f".{self._abs.name}.wb-lock"
        self._dir = self.path  # where shards go: the capture itself, or a staging directory
        try:
            self._abs.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CaptureError(f"cannot create the capture's parent directory: {e.strerror}", file=self._abs.parent,
                               fix="choose a writable location") from None
        self._lock()  # first: a second writer learns that one is at work, whatever the directory holds
        try:
            replace = False
            if self.path.exists() or self.path.is_symlink():
                if not self.path.is_dir():
                    raise CaptureError("capture path exists and is not a directory", file=self.path,
                                       fix="choose another path")
                if any(self.path.iterdir()):
                    if not overwrite:
                        raise CaptureError("capture directory exists and is not empty", file=self.path,
                                           fix="choose a new path or pass overwrite=True to replace it")
                    ok, why = is_workbench_capture(self.path)
                    if not ok:
                        raise CaptureError(f"refusing to overwrite a directory that does not look like a "
                                           f"capture: {why}", file=self.path,
                                           fix="remove it yourself or choose another path")
                    replace = True
            self._remove_stale()
            if replace:  # the old capture stays readable until close() swaps the new one in
                self._dir = self._abs.parent / f".{self._abs.name}{_STAGING}{secrets.token_hex(4)}"
            self._dir.mkdir(parents=True, exist_ok=True)
            (self._dir / MARKER).write_text(json.dumps({"pid": os.getpid(), "arm": arm,
                                                        "target": self.path.name}))
        except OSError as e:
            self._unlock()
            raise CaptureError(f"cannot write the capture: {e.strerror}", file=e.filename or self._dir,
                               fix="choose a writable location with free space") from None
        except BaseException:
            self._unlock()
            raise
        self._replace = replace
        self._cols: dict[str, list] = {c: [] for c in INDEX_COLUMNS}
        self._keys: set[tuple] = set()
        self._buffer: list[tuple[str, torch.Tensor]] = []
        self._buffered = 0
        self._shards: list[dict] = []
        self._written = 0
        self._seq = 0
        self._closed = False

    # -- locking and replacement ----------------------------------------------------------------
    def _lock(self) -> None:
        """An exclusive lock (flock on a file beside the capture) for the writer's life."""
        while True:
            try:
                fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise CaptureError(f"cannot create the writer's lock file: {e.strerror}", file=self._lock_path,
                                   fix="choose a writable location") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise CaptureLockedError("another CaptureWriter is writing this capture", file=self.path,
                                         fix="wait for it to close, or write to another path") from None
            try:  # the holder before us may have removed the file after we opened it: retry
                if os.stat(self._lock_path).st_ino == os.fstat(fd).st_ino:
                    self._lock_fd = fd
                    return
            except FileNotFoundError:
                pass
            os.close(fd)

    def _unlock(self) -> None:
        if self._lock_fd is None:
            return
        try:
            os.unlink(self._lock_path)
        except OSError:
            pass
        os.close(self._lock_fd)
        self._lock_fd = None

    def _remove_stale(self) -> None:
        """Staging and old directories of this capture left by a writer that died (we hold the lock)."""
        for p in self._abs.parent.glob(f".{self._abs.name}.wb-*-*"):
            if p.is_dir() and not p.is_symlink() and (p.name.startswith(f".{self._abs.name}{_OLD}")
                                                      or (p / MARKER).exists()):
                shutil.rmtree(p, ignore_errors=True)

    def _swap_in(self) -> None:
        """Put the staged capture at ``path`` and remove the old one."""
        old = self._abs.parent / f".{self._abs.name}{_OLD}{secrets.token_hex(4)}"
        if _exchange(self._dir, self._abs):
            self._dir.rename(old)  # the staging name now holds the old capture
        else:  # two renames; a crash between them leaves the old capture at .NAME.wb-old-*
            self._abs.rename(old)
            self._dir.rename(self._abs)
        fsync_dir(self._abs.parent)
        shutil.rmtree(old, ignore_errors=True)
        self._dir = self.path

    # -- public API ----------------------------------------------------------------------------
    @property
    def bytes_written(self) -> int:
        """Tensor bytes accepted so far (written or buffered)."""
        return self._written + self._buffered

    def __len__(self) -> int:
        return self._seq

    def add(self, tensor, /, *, rank: int = 0, step: int = 0, layer: int = -1, op: str, name: str,
            dims: str | None = None, **tags) -> int:
        """Add one tensor under key (rank, step, layer, op, name); returns its ``seq``.

        ``seq`` is the order of ``add`` calls: the causal order in which tensors were produced.
        ``dims`` is the tensor's layout spec (``"t h[tp:partial]"``, grammar in
        :mod:`workbench.capture.dims`), checked against its shape and kept as the tag ``dims``;
        with it, and the rank's coordinates as tags (``tp_rank``, ``tp_size``, ``cp_rank``...; a
        capture whose only parallel axis is one spec axis needs none), logical comparison rebuilds
        the tensor from its ranks. Tags are free-form scalars (str, int, finite float, bool, None),
        checked here so that ``close()`` cannot fail on them.
        """
        if self._closed:
            raise CaptureError("writer is closed", file=self.path, fix="open a new CaptureWriter")
        key = _check_key(rank, step, layer, op, name)
        if dims is not None:
            from workbench.capture.dims import DimsError, parse_dims

            try:
                parse_dims(dims).check(getattr(tensor, "shape", ()), where=f" {key['op']}/{key['name']}")
            except DimsError as e:
                raise DimsError(e.message, file=self.path, key=key, fix=e.fix) from None
            tags["dims"] = dims
        for k, v in tags.items():
            _check_tag(k, v, key)
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
            try:
                self._flush()
            except BaseException:
                self.abort()
                raise
        return seq

    def add_batch(self, step: int, *, requests, positions, rank: int = 0) -> None:
        """Say which request and position each token row of ``step`` belongs to, so that runs that
        batch, chunk or number steps differently align row by row (:mod:`workbench.capture.align`).

        ``requests``: one id per token row (a shared request id, or ``prompt_id(prompt tokens)``);
        ``positions``: the position of each row in its request. Written as ``batch/request``
        (indices into ``run["requests"]``) and ``batch/positions`` at layer -1.
        """
        import torch

        requests, positions = [str(r) for r in requests], [int(p) for p in positions]
        if len(requests) != len(positions) or not requests:
            raise CaptureError(f"add_batch needs one request id per position, got {len(requests)} ids and "
                               f"{len(positions)} positions", file=self.path, key="requests",
                               fix="pass requests=[id per token row], positions=[position per token row]")
        ids = self.run.setdefault("requests", [])
        where = self.__dict__.setdefault("_request_index", {r: i for i, r in enumerate(ids)})
        for r in requests:
            if r not in where:
                where[r] = len(ids)
                ids.append(r)
        self.add(torch.tensor([where[r] for r in requests], dtype=torch.int64), rank=rank, step=step, layer=-1,
                 op="batch", name="request")
        self.add(torch.tensor(positions, dtype=torch.int64), rank=rank, step=step, layer=-1, op="batch",
                 name="positions")

    def close(self) -> Path:
        """Write the last shard and commit the manifest (atomically); with ``overwrite=True`` swap
        the new capture in for the old one. Returns the capture path."""
        if self._closed:
            return self.path
        try:
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
            try:
                atomic_write_json(self._dir / MANIFEST, manifest)
            except (TypeError, ValueError) as e:  # run metadata changed after the constructor checked it
                raise CaptureError(f"run metadata is not strict JSON: {e}", file=self.path,
                                   fix="keep writer.run to strings, finite numbers, bools, lists and dicts") from None
            except OSError as e:
                raise self._os_error(e, self._dir / MANIFEST) from None
            (self._dir / MARKER).unlink(missing_ok=True)
            if self._replace:
                self._swap_in()
        except BaseException:
            self.abort()
            raise
        self._closed = True
        self._unlock()
        return self.path

    def abort(self) -> None:
        """Stop without committing. A replaced capture is left as it was (the staged files are
        removed); a new one stays an incomplete capture (no manifest), which the workbench
        refuses to open and may overwrite."""
        self._buffer.clear()
        self._buffered = 0
        if not self._closed and self._replace:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._closed = True
        self._unlock()

    def __del__(self) -> None:  # a writer dropped without close(): release the lock
        try:
            if getattr(self, "_lock_fd", None) is not None:
                self.abort()
        except Exception:
            pass

    def _os_error(self, e: OSError, file: Path) -> CaptureError:
        try:
            free = shutil.disk_usage(self._dir.parent).free
        except OSError:
            free = None
        written = f"{self._written} tensor bytes written before it"
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return DiskFullError(f"no space left writing the capture ({written}; "
                                 f"{'unknown' if free is None else free} bytes free on that file system)",
                                 file=file, fix="free space or write the capture elsewhere; nothing was committed")
        return CaptureError(f"cannot write the capture: {e.strerror or e} ({written})", file=file,
                            fix="check the path is writable; nothing was committed")

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
        start = len(self._cols["shard"]) - len(self._buffer)
        # each entry's key, so that verify can tell a manifest whose keys were swapped
        keys = {ename: [self._cols[f][start + j] for f in KEY_FIELDS] for j, (ename, _) in enumerate(self._buffer)}
        header: dict[str, Any] = {"__metadata__": {"format": FORMAT_NAME, "arm": self.arm,
                                                   "keys": json.dumps(keys, separators=(",", ":"))}}
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
        final = self._dir / rel
        tmp = final.with_suffix(".safetensors.tmp")
        try:
            with _open_shard(tmp) as f:
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
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise self._os_error(e, tmp) from None
        self._shards.append({"path": rel, "bytes": size, "sha256": sha.hexdigest()})
        pos = 0
        for j, (ename, t) in enumerate(self._buffer):
            self._cols["shard"][start + j] = idx
            self._cols["offset"][start + j] = base + pos
            pos += t.numel() * t.element_size()
        self._written += self._buffered
        self._buffer = []
        self._buffered = 0
