"""Token alignment: compare runs that batch, chunk or number their steps differently, row by row
of (request, position) instead of step by step.

A capture that can be aligned says, for every step, which request and position each token row
belongs to: two integer tensors at layer -1, ``batch/request`` ``[T]`` (an index into
``run["requests"]``, the request ids) and ``batch/positions`` ``[T]``, written by
:meth:`CaptureWriter.add_batch <workbench.capture.writer.CaptureWriter.add_batch>` (or an
importer). Request ids are whatever identifies a request in both runs: a shared id, or
:func:`prompt_id` of its prompt tokens where the engine's ids are random.

The control's steps define the comparison. For each control tensor of a step:

* a tensor whose token dim (the ``t`` of its ``dims`` spec, else dim 0, else dim 1 after a
  size-1 batch dim) has one row per token row of the step is rebuilt from the candidate's rows
  of the same (request, position), from whatever steps hold them: an unchunked 128-token prefill
  against 64 + 64 chunks, a request alone against the same request inside a batch;
* a tensor with one row per request of the step (logits of the last position, say) is rebuilt
  from the candidate's per-request rows at the same (request, last position);
* a tensor with neither (a recurrent state after the step), in a step of one request, is the
  candidate's tensor of the step that ends at the same position of that request (the state after
  token 127 whether the prefill ran as 128 or as 64 + 64);
* any other tensor keeps its key (compared step with step).

Candidate rows no control row asks for are listed in :attr:`AlignedPair.notes`.

Example
-------
>>> pair = align_tokens(open_capture("runs/unchunked"), open_capture("runs/chunked"))   # doctest: +SKIP
>>> compare_captures("runs/unchunked", "runs/chunked", align="tokens")                  # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, defaultdict
from typing import Sequence

import numpy as np
import pandas as pd

from workbench.capture.format import KEY_FIELDS
from workbench.errors import AnalysisError

__all__ = ["BATCH_OP", "prompt_id", "batch_rows", "align_tokens", "AlignedView"]

BATCH_OP = "batch"


def prompt_id(token_ids: Sequence[int]) -> str:
    """A request id from its prompt tokens (the same in every run that serves that prompt)."""
    ids = np.asarray([int(t) for t in token_ids], dtype=np.int64)
    return "prompt:" + hashlib.sha1(ids.tobytes()).hexdigest()[:16]


def batch_rows(cap, step: int, rank: int | None = None) -> list[tuple[str, int]] | None:
    """``[(request id, position)]`` of a step's token rows (None: the step has no batch tensors)."""
    sel = dict(op=BATCH_OP, step=step, layer=-1)
    idx = cap.index
    m = (idx["op"] == BATCH_OP) & (idx["step"] == step) & (idx["layer"] == -1)
    if rank is not None and (m & (idx["rank"] == rank)).any():
        m &= idx["rank"] == rank
    rows = idx[m]
    if not {"request", "positions"} <= set(rows["name"]):
        return None
    r0 = int(rows["rank"].iloc[0])
    read = cap.tensor if hasattr(cap, "tensor") else cap._tensor  # a logical view, or a capture
    get = lambda n: read(rows[(rows["name"] == n) & (rows["rank"] == r0)].iloc[0]).reshape(-1).tolist()
    req, pos = get("request"), get("positions")
    ids = (cap.run.get("requests") or [])
    if len(req) != len(pos) or any(not 0 <= r < len(ids) for r in req):
        raise AnalysisError(f"step {step}: batch/request and batch/positions disagree, or a request index is not in "
                            f"run['requests'] ({len(ids)} ids)", key=str(sel), file=getattr(cap, "path", None),
                            fix="write them with CaptureWriter.add_batch")
    return [(str(ids[r]), int(p)) for r, p in zip(req, pos)]


def _row_slice(row, T: int) -> tuple[int, int]:
    """The step's token rows a tensor holds: all ``(0, T)``, or ``(a, b)`` from its tag
    ``positions="a:b"`` (a recorder that keeps only the last rows of a long prefill)."""
    tag = (row["tags"] or {}).get("positions")
    if isinstance(tag, str) and tag.count(":") == 1:
        a, b = tag.split(":")
        if a.strip().isdigit() and b.strip().isdigit() and 0 <= int(a) < int(b) <= T:
            return int(a), int(b)
    return 0, T


def _token_dim(row, T: int, R: int) -> tuple[int, str] | None:
    """(dim, 'token' | 'request') of a tensor whose rows are the step's tokens or requests."""
    shape = list(row["shape"])
    spec = ((row["tags"] or {}).get("dims") or "").split("#")[0].split()
    if "t" in spec and len(spec) == len(shape):
        d = spec.index("t")
        return (d, "token") if shape[d] == T else (d, "request") if shape[d] == R else None
    if spec and len(spec) == len(shape):
        return None  # a spec without a token axis (a weight, a state): its rows are not tokens
    for d in (0, 1):
        if len(shape) > d and all(n == 1 for n in shape[:d]):
            if shape[d] == T:
                return d, "token"
            if shape[d] == R and R != T:
                return d, "request"
    return None


class AlignedView:
    """A candidate seen through the control's steps (see the module docstring): its index holds the
    control's keys it can rebuild; :meth:`tensor` gathers the rows."""

    def __init__(self, base, index: pd.DataFrame, plans: dict) -> None:
        self.base = base
        self.cap = getattr(base, "cap", base)
        self.path, self.arm, self.run = base.path, base.arm, base.run
        self.index = index
        self._plans = plans
        self._cache: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return len(self.index)

    @property
    def replicas(self) -> list[dict]:
        return getattr(self.base, "replicas", [])

    @property
    def notes(self) -> list[str]:
        return getattr(self.base, "notes", [])

    def select(self, **filters) -> "AlignedView":
        m = np.ones(len(self.index), dtype=bool)
        for k, v in filters.items():
            if callable(v):
                m &= self.index[k].map(v).to_numpy(dtype=bool)
                continue
            vals = v if isinstance(v, (list, tuple, set, range)) else [v]
            m &= self.index[k].isin(list(vals)).to_numpy()
        return AlignedView(self.base, self.index[m].reset_index(drop=True), self._plans)

    def same_rows(self, key: tuple) -> bool:
        """Whether the candidate's tensor for a control ``key`` is its own tensor of that key, all
        rows in order (token alignment changed nothing for it)."""
        plan = self._plans.get(tuple(key))
        if plan is None:
            return True
        dim, parts = plan
        if dim is None:
            return int(parts["step"]) == int(key[1])
        if len(parts) != 1:
            return False
        src, rows = parts[0]
        return (int(src["step"]) == int(key[1]) and rows == list(range(len(rows)))
                and int(src["shape"][dim]) == len(rows))

    def _read(self, row):
        """A base tensor, shaped (a logical view rebuilds it; a capture reads it)."""
        return self.base.tensor(row) if hasattr(self.base, "tensor") else self.base._tensor(row)

    def tensor(self, row):
        import torch

        key = tuple(row[f] for f in KEY_FIELDS)
        plan = self._plans.get(key)
        if plan is None:
            return self._read(row)
        if key in self._cache:
            return self._cache[key]
        dim, parts = plan  # [(base index row, [row indices])] in the control's row order
        if dim is None:  # a whole tensor of another step (a state after the step)
            return self._read(parts)
        pieces = [torch.as_tensor(self._read(src)).index_select(dim, torch.tensor(rows)) for src, rows in parts]
        t = torch.cat(pieces, dim)
        self._cache[key] = t
        while len(self._cache) > 4:
            self._cache.popitem(last=False)
        return t


class AlignedPair:
    """The result of :func:`align_tokens`: ``candidate`` (an :class:`AlignedView`), ``n_aligned``
    (control keys rebuilt from the candidate's rows), ``notes`` (what could not be aligned),
    ``skipped`` (control keys left out: their rows have other widths in the candidate)."""

    def __init__(self, candidate: AlignedView, n_aligned: int, notes: list[str], skipped=()) -> None:
        self.candidate, self.n_aligned, self.notes = candidate, n_aligned, notes
        self.skipped = set(skipped)  # control keys whose rows cannot be paired (left out of the comparison)


def align_tokens(control, candidate) -> AlignedPair:
    """Rebuild the candidate's token-row tensors on the control's steps by (request, position).

    Both captures (or logical views of them) need ``batch/request`` and ``batch/positions`` at
    every step (:meth:`CaptureWriter.add_batch`); AnalysisError says which arm lacks them.
    """
    steps_c = sorted(int(s) for s in control.index["step"].unique())
    steps_d = sorted(int(s) for s in candidate.index["step"].unique())
    rows_c = {s: batch_rows(control, s) for s in steps_c}
    rows_d = {s: batch_rows(candidate, s) for s in steps_d}
    for arm, rows in (("control", rows_c), ("candidate", rows_d)):
        missing = [s for s, r in rows.items() if r is None]
        if missing:
            cap = control if arm == "control" else candidate
            raise AnalysisError(f"the {arm} {cap.arm!r} has no batch/request and batch/positions at step(s) "
                                f"{missing[:8]}: its token rows cannot be aligned", key="align", file=cap.path,
                                fix="record them with CaptureWriter.add_batch(step, requests=, positions=), or "
                                    "compare step by step (align='steps')")
    # where each candidate (request, position) lives: per token, and per request at the last
    # position it has in a step
    tok_at, req_at, end_at = {}, {}, {}
    for s, rows in rows_d.items():
        if len(dict.fromkeys(rq for rq, _ in rows)) == 1:  # a step of one request ends at its last position
            end_at[(rows[0][0], max(p for _, p in rows))] = s
        last: dict[str, int] = {}
        for i, (rq, p) in enumerate(rows):
            tok_at[(rq, p)] = (s, i)
            last[rq] = max(last.get(rq, -1), p)
        order = list(dict.fromkeys(rq for rq, _ in rows))
        for j, rq in enumerate(order):
            req_at[(rq, last[rq])] = (s, j)
    didx = candidate.index
    by_key = {tuple(r[f] for f in KEY_FIELDS): i for i, r in didx.iterrows()}
    by_group = defaultdict(list)  # (rank, layer, op, name) -> steps of the candidate holding it
    for i, r in didx.iterrows():
        by_group[(r["rank"], r["layer"], r["op"], r["name"])].append(int(r["step"]))
    out_rows, plans, used, notes, n_aligned, skipped = [], {}, set(), [], 0, []
    for _, r in control.index.iterrows():
        if r["op"] == BATCH_OP:
            continue
        s = int(r["step"])
        rows = rows_c[s]
        R = len(dict.fromkeys(rq for rq, _ in rows))
        a, b = _row_slice(r, len(rows))
        how = _token_dim(r, b - a, R)
        key = tuple(r[f] for f in KEY_FIELDS)
        if how is None:
            src = by_key.get(key)
            if R == 1:  # state after the step (GDN state, conv window): the candidate's step ending at the same position
                cs = end_at.get((rows[0][0], max(p for _, p in rows)))
                src = by_key.get((key[0], cs, *key[2:])) if cs is not None else None
            if src is not None:
                new = didx.loc[src].copy()
                for f in KEY_FIELDS:
                    new[f] = r[f]
                out_rows.append(new)
                if src != by_key.get(key):
                    plans[key] = (None, didx.loc[src])
                used.add(src)
            continue
        dim, kind = how
        if kind == "token":
            wanted = [tok_at.get(rp) for rp in rows[a:b]]
        else:
            last: dict[str, int] = {}
            for rq, p in rows:
                last[rq] = max(last.get(rq, -1), p)
            wanted = [req_at.get((rq, last[rq])) for rq in dict.fromkeys(rq for rq, _ in rows)]
        group = (r["rank"], r["layer"], r["op"], r["name"])
        if any(w is None for w in wanted) or any((group[0], w[0], *group[1:]) not in by_key for w in wanted):
            continue  # some row is not in the candidate: the key is the control's only
        parts, cur, held = [], None, True
        for ws, wi in wanted:
            src = by_key[(group[0], ws, *group[1:])]
            lo, hi = _row_slice(didx.loc[src], len(rows_d[ws])) if kind == "token" else (0, wi + 1)
            if not lo <= wi < hi:  # the candidate kept only other rows of that step
                held = False
                break
            if cur is None or cur[0] != src:
                cur = (src, [])
                parts.append(cur)
            cur[1].append(wi - lo)
        if not held:
            continue
        used.update(src for src, _ in parts)
        first = didx.loc[parts[0][0]]
        widths = {tuple(v for j, v in enumerate(didx.loc[p]["shape"]) if j != dim) for p, _ in parts}
        if len(widths) > 1 or list(widths)[0] != tuple(v for j, v in enumerate(r["shape"]) if j != dim):
            # rows whose other dims differ by step (scores over the blocks cached so far): no row-wise pairing
            skipped.append(key)
            continue
        shape = list(first["shape"])
        shape[dim] = len(wanted)
        new = first.copy()
        for f in KEY_FIELDS:
            new[f] = r[f]
        new["shape"] = shape
        new["seq"] = min(int(didx.loc[p]["seq"]) for p, _ in parts)
        out_rows.append(new)
        plans[key] = (dim, [(didx.loc[p], ix) for p, ix in parts])
        n_aligned += 1
    if skipped:
        names = sorted({f"{k[3]}/{k[4]}" for k in skipped})
        notes.append(f"{len(skipped)} control tensor(s) not compared: their rows have other widths in the candidate's "
                     f"steps (a dim that grows with the cache): {names[:6]}")
    left = [i for i in didx.index if i not in used and didx.loc[i, "op"] != BATCH_OP]
    if left:
        ex = didx.loc[left[:3], list(KEY_FIELDS)].to_dict("records")
        notes.append(f"{len(left)} candidate tensor(s) hold no row the control asks for (e.g. {ex})")
    index = pd.DataFrame(out_rows).reset_index(drop=True) if out_rows else didx.iloc[0:0]
    return AlignedPair(AlignedView(candidate, index, plans), n_aligned, notes, skipped)
