"""Capture: a lazy, memory-mapped, indexed view of a capture directory."""

from __future__ import annotations

import hashlib
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    import torch

from workbench.capture.format import DTYPES, KEY_FIELDS, NUMPY_DTYPES, load_manifest, read_shard_header, safe_join
from workbench.errors import ChecksumError, DuplicateKeyError, KeyNotFoundError, ShardError

__all__ = ["Capture", "open_capture", "VerifyReport"]


@dataclass
class VerifyReport:
    """Result of :meth:`Capture.verify`: one row per shard with its status."""

    path: Path
    shards: pd.DataFrame

    @property
    def ok(self) -> bool:
        return bool((self.shards["status"] == "ok").all())

    def __str__(self) -> str:
        bad = self.shards[self.shards["status"] != "ok"]
        head = f"{self.path}: {len(self.shards)} shard(s), " + ("all ok" if self.ok else f"{len(bad)} bad")
        lines = [head] + [f"  {r.path}: {r.status}" for r in bad.itertuples()]
        return "\n".join(lines)


def open_capture(path: str | os.PathLike, *, verify: bool = False) -> "Capture":
    """Open a capture directory (lazy: reads only manifest.json, and checks every entry of it).

    The first read from a shard checks the shard's safetensors header against the manifest
    (dtype, shape, byte range and key of every tensor in it). ``verify=True`` also checks the
    shard's sha256 once, at that first read: it costs one sequential read of the shard (about
    a second per GB from disk, a few tenths from the page cache), paid once per shard.

    Raises IncompleteCaptureError, ManifestError, FormatVersionError, UnsafePathError or
    DuplicateKeyError with the file, key and fix.
    """
    return Capture(path, verify=verify)


def _match(col: pd.Series, want: Any) -> np.ndarray:
    if callable(want):
        return col.map(want).to_numpy(dtype=bool)
    if isinstance(want, slice):
        m = np.ones(len(col), dtype=bool)
        if want.start is not None:
            m &= (col >= want.start).to_numpy()
        if want.stop is not None:
            m &= (col < want.stop).to_numpy()
        return m
    if isinstance(want, (list, tuple, set, frozenset, range, np.ndarray)):
        return col.isin(list(want)).to_numpy()
    return (col == want).to_numpy()


class Capture:
    """A capture directory opened lazily.

    Attributes
    ----------
    path: the capture directory
    arm: the arm name written by the capture
    run: run metadata (dict)
    index: pandas DataFrame, one row per tensor: rank, step, layer, op, name, seq, dtype, shape,
        shard, offset, nbytes, tags (sorted by seq)

    Example
    -------
    >>> cap = open_capture("captures/control")                          # doctest: +SKIP
    >>> cap.select(op="gdn", name="state").index[["layer", "step"]]     # doctest: +SKIP
    >>> cap.get(layer=3, op="gdn", name="output", step=5)               # doctest: +SKIP
    """

    def __init__(self, path: str | os.PathLike, *, verify: bool = False, _manifest: dict | None = None,
                 _index: pd.DataFrame | None = None, _shared: dict | None = None) -> None:
        self.path = Path(path)
        m = _manifest if _manifest is not None else load_manifest(self.path)
        self._manifest = m
        self.verify_on_read = bool(verify)
        # state shared by every view of this capture: the shards whose header (and, with verify,
        # sha256) matched the manifest, and the manifest rows grouped by shard
        self._shared: dict = {"checked": set(), "rows_by_shard": None} if _shared is None else _shared
        self.arm: str = m["arm"]
        self.run: dict = m["run"]
        self.shards: list[dict] = m["shards"]
        if _index is None:
            cols = m["tensors"]
            df = pd.DataFrame({c: cols[c] for c in cols})
            if len(df) == 0:
                df = pd.DataFrame({c: pd.Series(dtype=t) for c, t in (
                    ("rank", "int64"), ("step", "int64"), ("layer", "int64"), ("op", "object"),
                    ("name", "object"), ("seq", "int64"), ("dtype", "object"), ("shape", "object"),
                    ("shard", "int64"), ("offset", "int64"), ("nbytes", "int64"), ("tags", "object"))})
            dup = df.duplicated(list(KEY_FIELDS), keep=False)
            if dup.any():
                row = df[dup].iloc[0]
                raise DuplicateKeyError(
                    f"manifest lists {int(dup.sum())} tensors with duplicate keys",
                    file=self.path / "manifest.json", key={f: row[f] for f in KEY_FIELDS},
                    fix="the manifest was edited or produced by a faulty writer; re-capture",
                )
            df = df.sort_values("seq", kind="stable").reset_index(drop=True)
            _index = df
        self.index: pd.DataFrame = _index

    # -- basic views ---------------------------------------------------------------------------
    @property
    def created(self) -> str | None:
        return self._manifest.get("created")

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        return f"<Capture arm={self.arm!r} tensors={len(self)} path={str(self.path)!r}>"

    def keys(self) -> list[tuple]:
        """(rank, step, layer, op, name) of every tensor, in causal (seq) order."""
        return list(self.index[list(KEY_FIELDS)].itertuples(index=False, name=None))

    def summary(self) -> pd.DataFrame:
        """Count and bytes per (op, name)."""
        g = self.index.groupby(["op", "name"], sort=False)
        return g.agg(tensors=("seq", "size"), bytes=("nbytes", "sum"),
                     layers=("layer", "nunique"), steps=("step", "nunique"),
                     ranks=("rank", "nunique")).reset_index()

    @property
    def total_bytes(self) -> int:
        return int(self.index["nbytes"].sum())

    def select(self, **filters: Any) -> "Capture":
        """A filtered view. Each filter is a value, a list/range of values, a slice over ints
        (start inclusive, stop exclusive) or a predicate; ``tag_<name>=`` filters on a tag.

        >>> cap.select(op=["gdn", "qsa"], layer=slice(0, 4), name="output")   # doctest: +SKIP
        """
        df = self.index
        m = np.ones(len(df), dtype=bool)
        for k, want in filters.items():
            if k.startswith("tag_"):
                col = df["tags"].map(lambda t, _k=k[4:]: t.get(_k))
            elif k in df.columns:
                col = df[k]
            else:
                raise KeyNotFoundError(
                    f"unknown filter {k!r}", file=self.path,
                    fix=f"filter on one of {list(KEY_FIELDS) + ['seq', 'dtype']} or tag_<name>",
                )
            m &= _match(col, want)
        return Capture(self.path, verify=self.verify_on_read, _manifest=self._manifest,
                       _index=df[m].reset_index(drop=True), _shared=self._shared)

    def _row(self, key: dict) -> pd.Series:
        view = self.select(**key)
        if len(view) == 1:
            return view.index.iloc[0]
        if len(view) == 0:
            raise KeyNotFoundError("no tensor matches the key", file=self.path, key=key,
                                   fix="list keys with cap.index or `workbench inspect`")
        sample = view.index[list(KEY_FIELDS)].head(5).to_dict("records")
        raise KeyNotFoundError(
            f"{len(view)} tensors match the key; it must identify one (first: {sample})",
            file=self.path, key=key, fix="add rank=, step=, layer=, op= or name= to narrow it",
        )

    # -- reading -------------------------------------------------------------------------------
    def shard_path(self, shard: int) -> Path:
        return safe_join(self.path, self.shards[shard]["path"], what=f"shards[{shard}]")

    def _map(self, row) -> np.ndarray:
        """Memory-map one tensor's bytes as a flat numpy array (copy-on-write: never alters the
        file; unmapped when the array is dropped, so reading a capture holds no more memory than
        the tensors in use)."""
        dt = NUMPY_DTYPES[row["dtype"]]
        n = int(row["nbytes"]) // dt.itemsize
        if n == 0:
            return np.empty(0, dtype=dt)
        off = int(row["offset"])
        p = self._shard_file(int(row["shard"]), key=row, end=off + int(row["nbytes"]))
        return np.memmap(p, dtype=dt, mode="c", offset=off, shape=(n,))

    def shard_buffer(self, shard: int, *, key=None, end: int = 0) -> np.ndarray:
        """The whole shard file as one flat uint8 array, memory-mapped copy-on-write (a new
        mapping per call: pages are read on first touch and the mapping goes with the array),
        after the shard's header was checked against the manifest (and, with ``verify``, its
        sha256). Bulk readers take their tensors as slices of it; ``end`` (with the ``key`` of
        the tensor ending there) is where the last of them ends: a shorter file is a truncated
        shard, named as :meth:`get` names it."""
        p = self._shard_file(shard, key=key, end=end)
        return np.memmap(p, dtype=np.uint8, mode="c") if self._shared["sizes"][shard] else np.empty(0, np.uint8)

    def _shard_file(self, shard: int, *, key=None, end: int = 0) -> Path:
        """The shard's path, once its header was checked (cached, with its size, for the
        capture and every view of it); raises ShardError when it is missing, not a file, or
        shorter than ``end`` bytes."""
        sizes = self._shared.setdefault("sizes", {})
        paths = self._shared.setdefault("paths", {})
        if shard in sizes and sizes[shard] >= end:
            return paths[shard]
        p = self.shard_path(shard)
        kd = {f: key[f] for f in KEY_FIELDS} if key is not None else None
        try:
            st = p.stat()
        except FileNotFoundError:
            raise ShardError("shard file is missing", file=p, key=kd,
                             fix="restore the shard from the source, or re-capture") from None
        if not stat.S_ISREG(st.st_mode):
            raise ShardError("the shard is not a regular file", file=p, key=kd,
                             fix="the manifest names a directory or device; restore the shard or re-capture")
        if st.st_size < end:
            raise ShardError(f"shard is truncated: {st.st_size} bytes, the tensor ends at byte {end}",
                             file=p, key=kd, fix="re-copy the shard (the copy was cut short) or re-capture")
        if shard not in self._shared["checked"]:
            self._check_shard(shard, p, sha=self.verify_on_read)
        sizes[shard], paths[shard] = st.st_size, p
        return p

    def __getstate__(self) -> dict:
        # what crosses to another process (a dask worker): no mappings; the receiver checks the
        # headers of the shards it reads again, on its own copy of the files
        state = dict(self.__dict__)
        state["_shared"] = {"checked": set(), "rows_by_shard": self._shared.get("rows_by_shard")}
        return state

    def _shard_rows(self, shard: int) -> dict[str, list]:
        """The manifest rows stored in ``shard``, as columns (grouped once per capture, not
        scanned per shard)."""
        cols = self._manifest["tensors"]
        groups = self._shared["rows_by_shard"]
        if groups is None:
            sh = np.asarray(cols["shard"], dtype=np.int64)
            order = np.argsort(sh, kind="stable")
            bounds = np.searchsorted(sh[order], np.arange(len(self.shards) + 1))
            groups = [order[bounds[i]:bounds[i + 1]] for i in range(len(self.shards))]
            self._shared["rows_by_shard"] = groups
        fields = ("rank", "step", "layer", "op", "name", "seq", "dtype", "shape", "offset", "nbytes")
        idx = groups[shard].tolist()
        return {c: [cols[c][i] for i in idx] for c in fields}

    def _check_shard(self, shard: int, p: Path, *, sha: bool, chunk: int = 8 << 20) -> None:
        """The shard's header agrees with every manifest entry that points into it (raises
        ShardError naming the first disagreement); with ``sha``, its sha256 matches too."""
        meta = self.shards[shard]
        if p.stat().st_size != meta["bytes"]:
            raise ChecksumError(f"shard size is {p.stat().st_size} bytes, the manifest says {meta['bytes']}",
                                file=p, fix="the shard was truncated or modified; re-copy it or re-capture")
        if sha:
            digest = _sha256(p, chunk)
            if digest != meta["sha256"]:
                raise ChecksumError(f"shard sha256 {digest[:16]}... differs from the manifest's "
                                    f"{meta['sha256'][:16]}...", file=p,
                                    fix="the shard was modified after capture; re-copy it or re-capture")
        problem = header_mismatch(p, self._shard_rows(shard))
        if problem is not None:
            msg, key = problem
            raise ShardError(f"the manifest and the shard's header disagree: {msg}", file=p, key=key,
                             fix="the manifest or the shard was edited or mixed up with another capture's; "
                                 "restore both from the source or re-capture")
        self._shared["checked"].add(shard)

    def raw(self, row) -> np.ndarray:
        """Flat numpy view of a tensor's stored elements (bf16 as uint16 bits); lazy."""
        return self._map(row)

    def _tensor(self, row) -> torch.Tensor:
        import torch  # here, not at import: `workbench inspect` reads captures without torch

        arr = self._map(row)
        tdt = DTYPES[row["dtype"]][0]
        t = torch.from_numpy(arr) if arr.size else torch.empty(0, dtype=torch.from_numpy(arr).dtype)
        if t.dtype != tdt:
            t = t.view(tdt)
        return t.reshape(row["shape"])

    def get(self, **key: Any) -> torch.Tensor:
        """The one tensor matching ``key`` (any subset of rank, step, layer, op, name, seq).

        The tensor is memory-mapped copy-on-write: pages are read on first touch and writes stay
        private to this process.
        """
        return self._tensor(self._row(key))

    def __iter__(self) -> Iterator[tuple[dict, torch.Tensor]]:
        for _, row in self.index.iterrows():
            yield {f: row[f] for f in KEY_FIELDS}, self._tensor(row)

    def tensors(self) -> Iterator[tuple[dict, torch.Tensor]]:
        """Iterate (key, tensor) in causal order."""
        return iter(self)

    # -- xarray ---------------------------------------------------------------------------------
    def to_xarray(self, dims: Sequence[str] = ("layer", "step", "rank"), *, name: str | None = None,
                  dtype=None, **filters: Any):
        """Stack same-shaped tensors into a lazy xarray.DataArray with ``dims`` + tensor dims.

        Filters (as in :meth:`select`) pick the tensors, which must differ only in ``dims`` and
        all have one shape. Nothing is read until values are accessed; indexing reads only the
        tensors needed. bf16/fp16/fp8 values are presented as float32 (numpy has no bf16).
        """
        from workbench.capture.xarray_view import stacked_dataarray

        view = self.select(**filters) if filters else self
        return stacked_dataarray(view, tuple(dims), name=name, dtype=dtype)

    # -- integrity -----------------------------------------------------------------------------
    def verify(self, *, raise_on_error: bool = True, chunk: int = 8 << 20, client=None) -> VerifyReport:
        """Check every shard: it exists, its size and sha256 match the manifest, its safetensors
        header is valid (as the safetensors library checks it) and agrees with every manifest
        entry that points into it (dtype, shape, byte range and, where the writer recorded it,
        the key).

        Raises ChecksumError/ShardError (naming the file, the key and the fix) unless
        ``raise_on_error=False``, in which case the report lists the status of each shard.
        ``client`` (a ``dask.distributed.Client``): one task per shard on its workers, which
        must see the capture at the same path.
        """
        if client is not None:
            from workbench.analysis.distributed import verify_on

            results = verify_on(client, self, chunk=chunk)
        else:
            results = [self._verify_shard(i, chunk) for i in range(len(self.shards))]
        rows = [r for r, _ in results]
        first_error = next((e for _, e in results if e is not None), None)
        report = VerifyReport(self.path, pd.DataFrame(rows, columns=["shard", "path", "bytes", "status"]))
        if first_error is not None and raise_on_error:
            raise first_error
        return report

    def _verify_shard(self, i: int, chunk: int = 8 << 20) -> tuple[dict, Exception | None]:
        """One shard's row of :meth:`verify` and the error that explains a bad status."""
        s = self.shards[i]
        p = self.shard_path(i)
        status = "ok"
        err: Exception | None = None
        if not p.exists():
            status = "missing"
            err = ShardError("shard file is missing", file=p, fix="restore it from the source or re-capture")
        elif not p.is_file():
            status = "not a regular file"
            err = ShardError("the shard is not a regular file", file=p,
                             fix="restore the shard from the source or re-capture")
        else:
            try:
                self._check_shard(i, p, sha=True, chunk=chunk)
            except ChecksumError as e:
                status = "sha256 mismatch" if "sha256" in e.message else f"size {p.stat().st_size} != {s['bytes']}"
                err = e
            except ShardError as e:
                status = ("header disagrees with manifest" if "disagree" in e.message
                          else "bad safetensors header")
                err = e
        return dict(shard=i, path=s["path"], bytes=s["bytes"], status=status), err


def _sha256(p: Path, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while b := f.read(chunk):
            h.update(b)
    return h.hexdigest()


_ENTRY = re.compile(r"t[0-9]+")


def _all_agree(entries: dict, meta: dict, cols: dict[str, list]) -> bool:
    """True when every row finds its own entry ``t<seq>`` with its offset, dtype, shape and size
    (and key, where the header lists keys): the common case, checked in bulk. False sends the
    caller through the row-by-row check, which names the first disagreement."""
    import json

    names = [f"t{q}" for q in cols["seq"]]
    get = entries.get
    for nm, off, dt, nb, shp in zip(names, cols["offset"], cols["dtype"], cols["nbytes"], cols["shape"]):
        h = get(nm)
        if h is None or h[2] != off or h[0] != dt or h[3] - h[2] != nb or list(h[1]) != list(shp):
            return False
    if "keys" in meta:
        try:
            keys = json.loads(meta["keys"])
        except ValueError:
            return False
        rows = zip(names, *(cols[f] for f in KEY_FIELDS))
        return all(list(keys[r[0]]) == list(r[1:]) for r in rows if r[0] in keys)
    return True


def header_mismatch(p: Path, rows) -> tuple[str, dict] | None:
    """The first way the shard's header disagrees with these manifest rows (a list of row dicts,
    or a dict of columns), or None."""
    import json

    _, entries, meta = read_shard_header(p)
    if isinstance(rows, dict):
        if _all_agree(entries, meta, rows):
            return None
        rows = [dict(zip(rows, vals)) for vals in zip(*rows.values())]
    by_start = {e[2]: (name, e) for name, e in entries.items() if e[3] > e[2]}  # non-empty ones
    # a CaptureWriter names entry seq s "t<s>": then each row must find its own entry
    ours = meta.get("format") == "workbench-capture" and all(_ENTRY.fullmatch(n) for n in entries)
    keys = None
    if "keys" in meta:
        try:
            keys = json.loads(meta["keys"])
        except ValueError:
            return "its __metadata__ keys are not JSON", {}
    for r in rows:
        key = {f: r[f] for f in KEY_FIELDS}
        own = f"t{r['seq']}"  # the name CaptureWriter gives each entry
        if own in entries:
            hit = (own, entries[own])
            if hit[1][2] != r["offset"] and r["nbytes"] > 0:
                return (f"seq {r['seq']} starts at byte {r['offset']} in the manifest, the shard's {own!r} "
                        f"at byte {hit[1][2]}"), key
        elif ours:
            return f"the shard holds no entry {own!r} for seq {r['seq']}", key
        elif r["nbytes"] == 0:
            continue  # an empty tensor occupies no bytes
        else:
            hit = by_start.get(r["offset"])
        if hit is None:
            return f"no tensor of the shard starts at byte {r['offset']} (seq {r['seq']})", key
        name, (dt, shape, start, end) = hit
        if dt != r["dtype"] or list(shape) != list(r["shape"]) or end - start != r["nbytes"]:
            return (f"seq {r['seq']} is {r['dtype']} {list(r['shape'])} in the manifest, the shard's {name!r} at "
                    f"that offset is {dt} {list(shape)}"), key
        if keys is not None and name in keys and list(keys[name]) != [r[f] for f in KEY_FIELDS]:
            return f"the shard's {name!r} was written as key {keys[name]}, the manifest says {list(key.values())}", key
    return None
