"""Tensor layout specs (``dims``): named axes, how each is split over parallel ranks, which values
are partial sums, which copies are replicated; and the unsharding that rebuilds a logical tensor
from what each rank holds.

Grammar (one spec per tensor, whitespace separates dims)::

    spec      := dim (" " dim)* ["#" decl (" " decl)*]
    dim       := NAME [mods] | "(" NAME ("*" NAME)+ ")" [mods] | "1"
    mods      := "[" shard ("," shard)* "]"            shard := AXIS [":" QUAL ("+" QUAL)*]
               | "(" item ("," item)* ")"              item  := AXIS | QUAL   (older form)
    QUAL      := "natural" | "zigzag" | "partial" | "sharded" | "grouped"
    decl      := AXIS ":replicated" | "dp:=" NAME

Examples: ``t h[tp]`` (hidden split over tensor-parallel ranks in rank order), ``t h[tp:partial]``
(each rank holds a partial sum of the whole tensor), ``b s[cp:zigzag] h[tp] d`` (sequence split
over context-parallel ranks in zigzag order), ``t h # tp:replicated`` (every tp rank holds the
same copy), ``(heads*d)[tp]`` (a fused dim split as a whole), ``b s(cp,zigzag) h(tp) d`` (older
form of the same), ``1 h`` (a size-1 dim), ``t kvh[tp:grouped] d`` (GQA KV heads when there are fewer heads than
ranks: consecutive ranks hold the same piece, each run of equal pieces is one piece of the
split). ``AXIS`` is one of :data:`AXES`.

A dim with several shards (``s[cp:zigzag,sp]``) is split by the first axis, then each piece by the
next. ``zigzag`` over N ranks cuts the dim into 2N chunks; rank r holds chunks r and 2N-1-r.

Example
-------
>>> d = Dims.parse("t h[tp:partial]")
>>> d.partial_axes(), d.sharded_axes()
(('tp',), {})
>>> Dims.parse("b s[cp:zigzag] h(tp) d").sharded_axes()
{'cp': (1, 'zigzag'), 'tp': (2, 'natural')}
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping, Sequence

from workbench.errors import DimsError

__all__ = ["AXES", "Shard", "Dim", "Dims", "DimsError", "unshard", "shard_of", "parse_dims"]

AXES = ("tp", "cp", "ep", "sp", "dp", "pp", "etp", "edp", "attn_tp", "attn_dp", "attn_cp", "moe_ep", "moe_tp",
        "moe_dp")
QUALIFIERS = ("natural", "zigzag", "partial", "sharded", "grouped")

_NAME = re.compile(r"[A-Za-z_]\w*")
_DIM = re.compile(r"(?P<name>[A-Za-z_]\w*|1)(?:\[(?P<br>[^\]]*)\]|\((?P<pa>[^)]*)\))?")
_FUSED = re.compile(r"\((?P<inner>[^()]*\*[^()]*)\)(?:\[(?P<br>[^\]]*)\]|\((?P<pa>[^)]*)\))?")
_FIX = "write e.g. 't h[tp]', 't h[tp:partial]', 'b s[cp:zigzag] h[tp] d' or 't h # tp:replicated'"


@dataclass(frozen=True)
class Shard:
    """One parallel axis acting on a dim: split over its ranks (``order`` natural or zigzag), or,
    with ``partial``, a partial sum over them."""

    axis: str
    order: str = "natural"
    partial: bool = False
    grouped: bool = False  # runs of consecutive ranks hold the same piece (GQA KV heads over more ranks)


@dataclass(frozen=True)
class Dim:
    name: str  # "h", "1", or a fused "heads*d"
    shards: tuple[Shard, ...] = ()


@dataclass(frozen=True)
class Dims:
    """A parsed spec; :meth:`parse` builds one, ``str()`` gives the text back."""

    dims: tuple[Dim, ...]
    replicated: frozenset[str] = frozenset()
    dp_alias: str | None = None
    text: str = field(default="", compare=False)

    def __str__(self) -> str:
        return self.text

    @classmethod
    def parse(cls, text: str) -> "Dims":
        return parse_dims(text)

    def sharded_axes(self) -> dict[str, tuple[int, str]]:
        """``{axis: (dim index, order)}`` of the axes that split a dim."""
        return {s.axis: (i, s.order) for i, d in enumerate(self.dims) for s in d.shards if not s.partial}

    def split_order(self, dim: int) -> tuple[str, ...]:
        """The axes splitting ``dim``, outermost first."""
        return tuple(s.axis for s in self.dims[dim].shards if not s.partial)

    def grouped_axes(self) -> tuple[str, ...]:
        return tuple(s.axis for d in self.dims for s in d.shards if s.grouped and not s.partial)

    def partial_axes(self) -> tuple[str, ...]:
        return tuple(s.axis for d in self.dims for s in d.shards if s.partial)

    def check(self, shape: Sequence[int], *, where: str = "") -> None:
        """DimsError unless the spec has one dim per tensor dim and its ``1`` dims have size 1."""
        shape = list(shape)
        if len(shape) != len(self.dims):
            raise DimsError(f"dims spec {self.text!r} names {len(self.dims)} dim(s), the tensor{where} has "
                            f"{len(shape)} (shape {shape})", key="dims",
                            fix="name one dim per tensor dim (use '1' for a size-1 dim)")
        for i, (d, n) in enumerate(zip(self.dims, shape)):
            if d.name == "1" and n != 1:
                raise DimsError(f"dims spec {self.text!r}: dim {i} is '1' but the tensor{where} has size {n} there",
                                key="dims", fix="name that dim")


def _shard_items(text: str, token: str, bracket: bool) -> tuple[Shard, ...]:
    shards: list[dict] = []
    parts = [p.strip() for p in text.split(",")] if text.strip() else []
    if not parts:
        raise DimsError(f"empty modifiers in dims token {token!r}", key=token, fix=_FIX)
    for part in parts:
        if bracket:  # axis[:qual+qual]
            axis, _, quals = part.partition(":")
            items = [axis.strip()] + [q.strip() for q in quals.split("+") if q.strip()]
            if ":" in part and len(items) == 1:
                raise DimsError(f"empty qualifier in {part!r} of dims token {token!r}", key=token, fix=_FIX)
        else:  # older form: axes and qualifiers mixed, a qualifier applies to the axis before it
            items = [part]
        for j, item in enumerate(items):
            if item in AXES and (not bracket or j == 0):
                if any(s["axis"] == item for s in shards):
                    raise DimsError(f"axis {item!r} appears twice in dims token {token!r}", key=token, fix=_FIX)
                shards.append({"axis": item})
            elif item in QUALIFIERS and shards and (not bracket or j > 0):
                s = shards[-1]
                if item == "partial":
                    s["partial"] = True
                elif item == "grouped":
                    s["grouped"] = True
                elif item != "sharded":
                    if "order" in s:
                        raise DimsError(f"two orders for axis {s['axis']!r} in dims token {token!r}", key=token, fix=_FIX)
                    s["order"] = item
            else:
                what = "qualifier" if item in QUALIFIERS or (bracket and j > 0) else "axis"
                raise DimsError(f"unknown {what} {item!r} in dims token {token!r}", key=token,
                                fix=f"axes are {list(AXES)}; qualifiers {list(QUALIFIERS)} follow an axis "
                                    f"({'axis:qual+qual' if bracket else 'axis, qual'})")
    return tuple(Shard(**s) for s in shards)


def parse_dims(text: str) -> Dims:
    """Parse a dims spec (grammar in the module docstring); DimsError quotes the bad token."""
    if not isinstance(text, str) or not text.split("#", 1)[0].strip():
        raise DimsError(f"a dims spec names at least one dim, got {text!r}", key="dims", fix=_FIX)
    body, _, decl = text.partition("#")
    dims: list[Dim] = []
    for token in body.split():
        m = _FUSED.fullmatch(token)
        if m:
            subs = [s.strip() for s in m.group("inner").split("*")]
            if not all(_NAME.fullmatch(s) for s in subs) or len(set(subs)) != len(subs):
                raise DimsError(f"bad fused dim {token!r}", key=token, fix="write e.g. '(heads*d)[tp]'")
            name = "*".join(subs)
        else:
            m = _DIM.fullmatch(token)
            if not m:
                raise DimsError(f"cannot read dims token {token!r}", key=token, fix=_FIX)
            name = m.group("name")
        br, pa = m.group("br"), m.group("pa")
        shards = _shard_items(br, token, True) if br is not None else _shard_items(pa, token, False) if pa is not None else ()
        if name == "1" and shards:
            raise DimsError(f"a size-1 dim cannot be sharded: {token!r}", key=token, fix="drop the modifiers")
        dims.append(Dim(name, shards))
    names = [n for d in dims if d.name != "1" for n in d.name.split("*")]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DimsError(f"dims spec {text!r} names {dup} twice", key="dims", fix="give every dim its own name")
    axes = [s.axis for d in dims for s in d.shards]
    if len(axes) != len(set(axes)):
        raise DimsError(f"dims spec {text!r} uses an axis on two dims", key="dims", fix="one dim per parallel axis")
    replicated, alias = set(), None
    for token in decl.split():
        if token.startswith("dp:="):
            if alias is not None or not _NAME.fullmatch(token[4:]):
                raise DimsError(f"bad dp alias {token!r} in {text!r}", key=token, fix="write one 'dp:=<group>'")
            alias = token[4:]
            continue
        axis, sep, what = token.partition(":")
        if sep and what == "replicated" and axis in AXES and axis not in replicated:
            if axis in axes:
                raise DimsError(f"axis {axis!r} is both sharded and replicated in {text!r}", key=token, fix=_FIX)
            replicated.add(axis)
            continue
        raise DimsError(f"cannot read declaration {token!r} after '#' in {text!r}", key=token,
                        fix=f"write '<axis>:replicated' (axes {list(AXES)}) or 'dp:=<group>'")
    return Dims(tuple(dims), frozenset(replicated), alias, text.strip())


# -- unsharding ---------------------------------------------------------------------------------

def _zigzag(pieces: list, dim: int):
    """Undo a zigzag split: piece r holds chunks r and 2N-1-r of 2N."""
    import torch

    n = len(pieces)
    chunks: list = [None] * (2 * n)
    for r, p in enumerate(pieces):
        if p.shape[dim] % 2:
            raise DimsError(f"a zigzag piece has odd length {p.shape[dim]} along dim {dim}", key="dims",
                            fix="zigzag pieces hold two equal chunks; check the order qualifier")
        a, b = p.split(p.shape[dim] // 2, dim)
        chunks[r], chunks[2 * n - 1 - r] = a, b
    return torch.cat(chunks, dim)


def group_size(pieces: Sequence) -> int:
    """The length of the runs of equal consecutive pieces along a grouped axis (the first run's
    length when it divides the count, else 1)."""
    import torch

    g = 1
    while g < len(pieces) and pieces[g].shape == pieces[0].shape and torch.equal(pieces[g], pieces[0]):
        g += 1
    return g if len(pieces) % g == 0 else 1


def _dedupe_runs(ts: list, cs: list, axis: str, bad: list) -> list:
    """One piece per run of ``group_size`` ranks; a rank whose copy differs from its run's first is
    listed in ``bad``."""
    import torch

    g = group_size(ts)
    out = []
    for i in range(0, len(ts), g):
        ref = ts[i]
        for c, t in zip(cs[i + 1:i + g], ts[i + 1:i + g]):
            if t.shape != ref.shape or not torch.equal(t, ref):
                diff = float((t.double() - ref.double()).abs().max()) if t.shape == ref.shape else float("inf")
                bad.append({"axis": axis, "coordinate": int(c), "max_abs": diff})
        out.append(ref)
    return out


def unshard(pieces: Mapping[tuple, object], coords: Sequence[str], dims: Dims | None) -> tuple[object, list[dict]]:
    """Rebuild the logical tensor from what each rank holds.

    Parameters
    ----------
    pieces: ``{(coordinate along each axis of coords): tensor}``, one per rank
    coords: the parallel axes of the coordinates (``("tp",)``, ``("cp", "tp")``)
    dims: the spec (None: every axis is replicated)

    Axes the spec neither splits nor marks partial are replicated: their copies must agree bit for
    bit (the lowest coordinate's copy is kept, each disagreeing copy listed). Partial sums are added
    in fp64 in coordinate order; splits are concatenated in coordinate order (zigzag undone),
    innermost axis of a dim first.

    Returns ``(tensor, replica_mismatches)``, each mismatch ``{"axis", "coordinate", "max_abs"}``.
    """
    import torch

    coords = list(coords)
    sharded = dims.sharded_axes() if dims else {}
    partial = set(dims.partial_axes()) if dims else set()
    grouped = set(dims.grouped_axes()) if dims else set()
    cur = {tuple(k): v for k, v in pieces.items()}
    bad: list[dict] = []

    def reduce_axis(axis: str, combine) -> None:
        nonlocal cur, coords
        i = coords.index(axis)
        groups: dict[tuple, list] = {}
        for k in sorted(cur):
            groups.setdefault(k[:i] + k[i + 1:], []).append((k[i], cur[k]))
        sizes = {len(g) for g in groups.values()}
        if len(sizes) != 1:
            raise DimsError(f"ranks along {axis} are missing for some pieces ({sorted(sizes)} found)", key=axis,
                            fix="import every rank of the run")
        cur = {rest: combine(axis, [t for _, t in g], [c for c, _ in g]) for rest, g in groups.items()}
        coords = coords[:i] + coords[i + 1:]

    def replicate(axis, ts, cs):
        ref = ts[0]
        for c, t in zip(cs[1:], ts[1:]):
            if t.shape != ref.shape or not torch.equal(t, ref):
                diff = float((t.double() - ref.double()).abs().max()) if t.shape == ref.shape else float("inf")
                bad.append({"axis": axis, "coordinate": int(c), "max_abs": diff})
        return ref

    def add(axis, ts, cs):
        out = ts[0].double().clone()
        for t in ts[1:]:
            out += t.double()
        return out

    def concat(axis, ts, cs):
        dim, order = sharded[axis]
        if axis in grouped:
            ts = _dedupe_runs(ts, cs, axis, bad)
        return _zigzag(ts, dim) if order == "zigzag" else torch.cat(ts, dim)

    for axis in [a for a in coords if a not in sharded and a not in partial]:
        reduce_axis(axis, replicate)
    for axis in [a for a in coords if a in partial]:
        reduce_axis(axis, add)
    inner_first = sorted((a for a in coords if a in sharded), key=lambda a: (
        sharded[a][0], -dims.split_order(sharded[a][0]).index(a)))
    for axis in inner_first:
        reduce_axis(axis, concat)
    (out,) = cur.values()
    return out, bad


def shard_of(tensor, dims: Dims, sizes: Mapping[str, int], coord: Mapping[str, int]):
    """The piece of a logical tensor that the rank at ``coord`` holds along the split axes of
    ``dims`` (the inverse of :func:`unshard`'s concatenation; partial and replicated axes leave the
    tensor whole)."""
    import torch

    out = tensor
    for i, d in enumerate(dims.dims):
        for s in d.shards:  # outermost first
            if s.partial or sizes.get(s.axis, 1) <= 1:
                continue
            n, r = sizes[s.axis], int(coord[s.axis])
            if s.order == "zigzag":
                chunks = out.chunk(2 * n, i)
                out = torch.cat([chunks[r], chunks[2 * n - 1 - r]], i)
            else:
                out = out.chunk(n, i)[r]
    return out
