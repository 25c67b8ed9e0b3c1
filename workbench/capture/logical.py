"""A capture seen as logical tensors: each (step, layer, op, name) rebuilt from what its ranks hold.

Two runs with other parallel layouts (TP1 against TP2, TP4, CP2...) hold different pieces under
different ranks; only the logical tensors compare. For each group of ranks holding one
(step, layer, op, name):

* with a ``dims`` spec (tag ``dims``, grammar in :mod:`workbench.capture.dims`): split axes are
  concatenated in coordinate order (zigzag undone), partial sums added in fp64 in coordinate
  order, and every other parallel axis is replicated: its copies must agree bit for bit, and a copy
  that does not is reported (:attr:`LogicalCapture.replicas`);
* without a spec: copies that agree bit for bit are one replicated tensor; copies that differ
  cannot be rebuilt and stay rank by rank (:attr:`LogicalCapture.notes` says which).

A rank's coordinates come from its tags ``<axis>_rank`` / ``<axis>_size`` (SGLang's parallel info,
or what a writer records); a group whose spec names one axis and whose tensors carry no
coordinates takes the ranks in order along that axis. Logical tensors have rank 0; seq is the
earliest of the group's. Reading is lazy: a logical tensor is rebuilt when read.

Example
-------
>>> view = LogicalCapture(open_capture("runs/tp2"))                   # doctest: +SKIP
>>> view.index[["step", "layer", "op", "name", "layout"]]             # doctest: +SKIP
>>> view.get(step=0, layer=0, op="mlp", name="output")                # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import pandas as pd

from workbench.capture.dims import AXES, Dims, group_size, parse_dims, unshard
from workbench.capture.format import KEY_FIELDS
from workbench.capture.reader import Capture
from workbench.errors import DimsError, KeyNotFoundError

__all__ = ["LogicalCapture", "has_layout", "layout_signature", "same_layout", "describe_layout"]

GROUP = ["step", "layer", "op", "name"]


def has_layout(cap: Capture) -> bool:
    """Whether any tensor of ``cap`` carries a ``dims`` spec."""
    return bool(cap.index["tags"].map(lambda t: bool((t or {}).get("dims"))).any())


def _layout_parts(cap: Capture) -> tuple[frozenset, dict]:
    idx = cap.index
    coords = idx["tags"].map(lambda t: tuple(sorted((k, v) for k, v in (t or {}).items()
                                                    if k.endswith(("_rank", "_size")) and k[:-5] in AXES)))
    ranks = frozenset(zip(idx["rank"].tolist(), coords.tolist()))
    specs: dict = {}
    for o, n, d in zip(idx["op"].tolist(), idx["name"].tolist(), idx["tags"].map(lambda t: (t or {}).get("dims")).tolist()):
        specs.setdefault((o, n), set()).add(d)
    return ranks, specs


def layout_signature(cap: Capture) -> frozenset:
    """What a capture's parallel layout is made of: its ranks with their coordinates, and each
    tensor's dims spec. Two captures with equal signatures pair up rank by rank."""
    ranks, specs = _layout_parts(cap)
    return ranks | frozenset(("spec", o, n, d) for (o, n), ds in specs.items() for d in ds)


def same_layout(caps) -> bool:
    """Whether these captures pair up rank by rank: the same ranks with the same coordinates, and
    the same dims specs for every tensor name they all hold (a tensor only one arm holds is a
    missing key, not another layout)."""
    parts = [_layout_parts(c) for c in caps]
    if len({r for r, _ in parts}) > 1:
        return False
    common = set.intersection(*(set(s) for _, s in parts)) if parts else set()
    return all(len({frozenset(s[k]) for _, s in parts}) == 1 for k in common)


def _coords(rows: pd.DataFrame, dims: Dims | None) -> tuple[list[str], list[tuple]] | str:
    """The parallel axes along which the group's ranks differ and each row's coordinates; a
    string says why they are unknown."""
    tags = rows["tags"].tolist()
    spec_axes = set()
    if dims is not None:
        spec_axes = set(dims.sharded_axes()) | set(dims.partial_axes()) | set(dims.replicated)
    sized = {a for a in AXES for t in tags if int((t or {}).get(f"{a}_size") or 1) > 1
             and (t or {}).get(f"{a}_rank") is not None}
    axes = sorted((sized & spec_axes) | ({"tp"} & sized), key=AXES.index)
    if axes:
        missing = sorted(a for a in spec_axes if a not in sized and any(f"{a}_rank" in (t or {}) for t in tags))
        if missing:
            return f"some ranks lack {missing} coordinates"
        return axes, [tuple(int(t[f"{a}_rank"]) for a in axes) for t in tags]
    if len(rows) == 1:
        return [], [()]
    if any(any(f"{a}_rank" in (t or {}) for a in AXES) for t in tags):
        return "the ranks' coordinates name no axis of the spec"
    one = sorted(spec_axes)
    if len(one) == 1:  # one axis in the spec and no coordinates: the ranks, in order, along it
        return one, [(i,) for i in range(len(rows))]
    return ["rank"], [(i,) for i in range(len(rows))]


class LogicalCapture:
    """The logical view of a :class:`~workbench.capture.reader.Capture` (see the module docstring).

    Attributes
    ----------
    index: one row per logical tensor: the key fields (rank 0 for rebuilt tensors), seq, dtype
        (``fp64`` where partial sums were added), shape, ``source_dtype`` (the ranks' dtype),
        ``layout`` (``"tp:concat(h)"``, ``"tp:sum"``, ``"tp:replicated"``, ``"single"``, ``"raw"``),
        ``ranks`` (the ranks it is built from)
    replicas: copies that should agree and do not, found as tensors are read (rank, axis,
        coordinate, max_abs and the key)
    notes: groups kept rank by rank, and why
    """

    def __init__(self, cap: Capture, *, _index: pd.DataFrame | None = None, _shared: dict | None = None) -> None:
        self.cap = cap
        self.path, self.arm, self.run = cap.path, cap.arm, cap.run
        self._shared = _shared if _shared is not None else {"replicas": [], "notes": [], "seen": set(),
                                                            "cache": OrderedDict()}
        self.index = _index if _index is not None else self._build()

    def __getstate__(self) -> dict:
        # to another process (a dask worker): the plans, not the tensors cached here nor the
        # findings so far (the receiver reports what it finds itself)
        state = dict(self.__dict__)
        state["_shared"] = {"replicas": [], "notes": list(self._shared["notes"]), "seen": set(),
                            "cache": OrderedDict()}
        return state

    @property
    def replicas(self) -> list[dict]:
        return self._shared["replicas"]

    @property
    def notes(self) -> list[str]:
        return self._shared["notes"]

    def __len__(self) -> int:
        return len(self.index)

    def __repr__(self) -> str:
        return f"<LogicalCapture arm={self.arm!r} tensors={len(self)} of {len(self.cap)} path={str(self.path)!r}>"

    # -- index -----------------------------------------------------------------------------------
    def _build(self) -> pd.DataFrame:
        idx = self.cap.index
        out = []
        for key, rows in idx.groupby(GROUP, sort=False):
            rows = rows.sort_values("rank")
            out.extend(self._group(dict(zip(GROUP, key)), rows))
        cols = [*KEY_FIELDS, "seq", "dtype", "shape", "source_dtype", "layout", "ranks", "tags", "_rows", "_plan"]
        df = pd.DataFrame(out, columns=cols)
        return df.sort_values("seq", kind="stable").reset_index(drop=True)

    def _group(self, key: dict, rows: pd.DataFrame) -> list[dict]:
        first = rows.iloc[0]
        specs = {(t or {}).get("dims") for t in rows["tags"]}
        where = f"step={key['step']} layer={key['layer']} op={key['op']} name={key['name']}"

        def raw(why: str | None) -> list[dict]:
            if why:
                self.notes.append(f"{where}: {why}; compared rank by rank")
            return [dict(key, rank=int(r["rank"]), seq=int(r["seq"]), dtype=r["dtype"], shape=list(r["shape"]),
                         source_dtype=r["dtype"], layout="raw", ranks=[int(r["rank"])], tags=r["tags"],
                         _rows=[i], _plan=None) for i, r in rows.iterrows()]

        if len(specs) > 1:
            return raw(f"the ranks give different dims specs {sorted(map(str, specs))}")
        spec = specs.pop()
        try:
            dims = parse_dims(spec) if spec else None
            if dims is not None:
                for _, r in rows.iterrows():
                    dims.check(r["shape"])
        except DimsError as e:
            return raw(f"dims {spec!r}: {e.message}")
        if len({r["dtype"] for _, r in rows.iterrows()}) > 1:
            return raw("the ranks hold different dtypes")
        got = _coords(rows, dims)
        if isinstance(got, str):
            return raw(got)
        axes, coords = got
        sizes = {a: len({c[i] for c in coords}) for i, a in enumerate(axes)}
        if len(set(coords)) != len(coords) or len(coords) != math.prod(sizes.values()):
            return raw(f"ranks {rows['rank'].tolist()} do not cover every coordinate of {sizes}")
        shape = list(first["shape"])
        sharded = dims.sharded_axes() if dims else {}
        partial = set(dims.partial_axes()) if dims else set()
        parts = []
        grouped = set(dims.grouped_axes()) if dims else set()
        for a in axes:
            if a in sharded:
                d, order = sharded[a]
                n = sizes[a]
                if a in grouped:  # runs of ranks hold the same piece: read them to find the run length
                    i = axes.index(a)
                    line = [r for r, c in zip(rows.itertuples(), coords) if all(c[j] == 0 for j in range(len(axes)) if j != i)]
                    n //= group_size([self.cap._tensor(self.cap.index.loc[r.Index]) for r in line])
                shape[d] *= n
                parts.append(f"{a}:concat({dims.dims[d].name}{',zigzag' if order == 'zigzag' else ''}"
                             f"{',grouped' if a in grouped else ''})")
            elif a in partial:
                parts.append(f"{a}:sum")
            else:
                parts.append(f"{a}:replicated")
        if any(list(r["shape"]) != list(first["shape"]) for _, r in rows.iterrows()):
            if dims is None:
                return raw("the ranks hold different shapes and no dims spec says how to join them")
        if dims is None and len(rows) > 1 and not self._replicas_agree(rows):
            return raw("the ranks hold different values and no dims spec says how to join them")
        return [dict(key, rank=0, seq=int(rows["seq"].min()),
                     dtype="fp64" if any(a in partial for a in axes) else first["dtype"], shape=shape,
                     source_dtype=first["dtype"], layout=" ".join(parts) or "single",
                     ranks=[int(r) for r in rows["rank"]], tags=first["tags"], _rows=list(rows.index),
                     _plan=(axes, coords, dims))]

    def _replicas_agree(self, rows: pd.DataFrame) -> bool:
        ref = self.cap.raw(rows.iloc[0])
        return all(np.array_equal(self.cap.raw(r), ref) for _, r in rows.iloc[1:].iterrows())

    # -- views and reading -----------------------------------------------------------------------
    def select(self, **filters) -> "LogicalCapture":
        df = self.index
        m = np.ones(len(df), dtype=bool)
        for k, want in filters.items():
            if k not in df.columns:
                raise KeyNotFoundError(f"unknown filter {k!r}", file=self.path, fix=f"filter on one of {list(KEY_FIELDS)}")
            if callable(want):
                m &= df[k].map(want).to_numpy(dtype=bool)
                continue
            vals = want if isinstance(want, (list, tuple, set, range)) else [want]
            m &= df[k].isin(list(vals)).to_numpy()
        return LogicalCapture(self.cap, _index=df[m].reset_index(drop=True), _shared=self._shared)

    def tensor(self, row):
        """The logical tensor of an index row (torch; fp64 where partial sums were added)."""
        import torch

        rid = tuple(row["_rows"])
        cache = self._shared["cache"]
        if rid in cache:
            return cache[rid]
        src = [self.cap.index.loc[i] for i in row["_rows"]]
        if row["_plan"] is None:
            t = self.cap._tensor(src[0])
        else:
            axes, coords, dims = row["_plan"]
            pieces = {c: self.cap._tensor(r) for c, r in zip(coords, src)}
            if not axes:
                t = next(iter(pieces.values()))
            else:
                t, bad = unshard(pieces, axes, dims)
                key = {f: row[f] for f in ("step", "layer", "op", "name")}
                if bad and rid not in self._shared["seen"]:
                    for b in bad:
                        rank = int(src[[c[axes.index(b["axis"])] for c in coords].index(b["coordinate"])]["rank"])
                        self.replicas.append({**key, "rank": rank, **b})
                self._shared["seen"].add(rid)
        cache[rid] = t
        while len(cache) > 4:
            cache.popitem(last=False)
        return t if isinstance(t, torch.Tensor) else torch.as_tensor(t)

    def get(self, **key):
        view = self.select(**key)
        if len(view) != 1:
            raise KeyNotFoundError(f"{len(view)} logical tensors match the key; it must identify one", file=self.path,
                                   key=key, fix="add step=, layer=, op= or name=")
        return self.tensor(view.index.iloc[0])



def describe_layout(cap: Capture) -> dict:
    """How a run is laid out, from its tensors and metadata: ranks, the parallel sizes recorded
    (``run["parallel"]``, the arm's ``tp``, or per-tensor ``<axis>_size`` tags), how many tensors
    carry a ``dims`` spec, and, where batch rows are recorded, how many steps the prompt took."""
    from workbench.capture.align import BATCH_OP, batch_rows

    idx = cap.index
    sizes = dict((cap.run or {}).get("parallel") or {})
    arm = (cap.run or {}).get("arm")
    if isinstance(arm, dict) and isinstance(arm.get("tp"), int):
        sizes.setdefault("tp", arm["tp"])
    for tags in idx["tags"]:
        for k, v in (tags or {}).items():
            if k.endswith("_size") and k[:-5] in AXES and isinstance(v, int):
                sizes.setdefault(k[:-5], v)
    specs = idx["tags"].map(lambda t: bool((t or {}).get("dims")))
    out = {"arm": cap.arm, "ranks": int(idx["rank"].nunique()), "parallel": sizes,
           "tensors_with_dims": int(specs.sum()), "tensors": int(len(idx)),
           "steps": int(idx["step"].nunique()), "batch_rows": bool((idx["op"] == BATCH_OP).any())}
    if out["batch_rows"]:
        prefill = 0
        for s in sorted(int(x) for x in idx["step"].unique()):
            rows = batch_rows(cap, s)
            if rows is None or len(rows) <= len(dict.fromkeys(r for r, _ in rows)):
                break  # a decode step: one row per request
            prefill += 1
        out["prefill_steps"] = prefill
    return out
