"""compare_captures compares small tensors in bulk (one mapping per shard, one kernel call per
pair of shards): every value must be the one compare() gives key by key."""

import math

import numpy as np
import pytest
import torch

from workbench import compare
from workbench.analysis.compare import compare_captures, pair_metrics
from workbench.capture import CaptureWriter, open_capture
from workbench.numerics.metrics import BATCH_MAX, FIELDS


def _arms(tmp_path, *, shard_bytes=1 << 10):
    """Two arms of mixed formats, odd sizes (so later tensors start off their alignment), NaN,
    Inf, zeros, a tensor above the bulk limit, an integer tensor and a key only one arm has."""
    g = torch.Generator().manual_seed(3)
    dts = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.bfloat16]
    paths = tmp_path / "a", tmp_path / "b"
    with CaptureWriter(paths[0], arm="a", shard_bytes=shard_bytes) as wa, \
            CaptureWriter(paths[1], arm="b", shard_bytes=shard_bytes) as wb:
        for i in range(60):
            dt = dts[i % len(dts)]
            shape = (1 + i % 7, 3) if i % 3 else (2 * i + 1,)
            a = torch.randn(shape, generator=g, dtype=torch.float64)
            b = a + (1e-3 * torch.randn(shape, generator=g, dtype=torch.float64) if i % 2 else 0)
            if i % 11 == 4:
                b.view(-1)[0] = float("nan")
            if i % 13 == 5:
                a.view(-1)[-1] = float("inf")
                b.view(-1)[-1] = float("inf")
            if i % 17 == 6:
                a = torch.zeros(shape, dtype=torch.float64)
            wa.add(a.to(dt), step=i // 10, layer=i % 10, op="x", name=f"t{i % 4}")
            wb.add(b.to(dt), step=i // 10, layer=i % 10, op="x", name=f"t{i % 4}")
        big = torch.randn(BATCH_MAX + 5, generator=g)
        wa.add(big, step=9, layer=0, op="x", name="big")
        wb.add(big * (1 + 1e-6), step=9, layer=0, op="x", name="big")
        ids = torch.arange(12, dtype=torch.int32)
        wa.add(ids, step=9, layer=1, op="x", name="ids")
        wb.add(ids.flip(0), step=9, layer=1, op="x", name="ids")
        wa.add(torch.ones(3), step=9, layer=2, op="x", name="only_a")
    return paths


def _same(x, y):
    if isinstance(x, float) and math.isnan(x):
        return isinstance(y, float) and math.isnan(y)
    return x == y


def test_bulk_values_are_compare_key_by_key(tmp_path, monkeypatch):
    import workbench.numerics.metrics as metrics

    pa, pb = _arms(tmp_path)
    ca, cb = open_capture(pa), open_capture(pb)
    assert len(ca.shards) >= 3  # several shards: pairs of shards are grouped
    calls = []
    real = metrics.compare_batch
    monkeypatch.setattr(metrics, "compare_batch", lambda *a, **k: calls.append(len(a[4])) or real(*a, **k))
    res = compare_captures(ca, cb)
    assert len(calls) >= 3 and sum(calls) >= 30  # most keys went through the bulk path
    assert res.grouping == "raw"  # a key only one arm holds is a missing key, not another layout
    t = res.table
    both = t[t["status"] != "only_control"]
    assert len(both) == len(ca) - 1
    checked = 0
    for _, row in both.iterrows():
        key = {f: row[f] for f in ("rank", "step", "layer", "op", "name")}
        ref = compare(ca.get(**key).reshape(-1), cb.get(**key).reshape(-1)).to_dict()  # the table indexes flat
        for f in FIELDS:
            assert _same(float(ref[f]), float(row[f])), (key, f, ref[f], row[f])
        assert (ref["max_abs_index"] or None) == (row["max_abs_index"] or None), key
        checked += 1
    assert checked == 62
    assert t.loc[t["name"] == "only_a", "status"].item() == "only_control"
    assert t.loc[t["name"] == "ids", "status"].item() == "diverged"
    assert (t["status"] == "nonfinite").sum() >= 1


def test_pair_metrics_agrees_between_bulk_and_one_by_one(tmp_path):
    pa, pb = _arms(tmp_path)
    ca, cb = open_capture(pa), open_capture(pb)
    n = len(cb)
    pos_a = np.array([int(np.flatnonzero(ca.index["seq"] == s)[0]) for s in cb.index["seq"]])
    bulk = pair_metrics(ca, cb, pos_a, np.arange(n))
    # views the bulk path does not take (a selected Capture still is one): forced key by key
    one = {f: [] for f in FIELDS}
    for i in range(n):
        r = compare(ca._tensor(ca.index.iloc[pos_a[i]]).reshape(-1), cb._tensor(cb.index.iloc[i]).reshape(-1))
        for f in FIELDS:
            one[f].append(getattr(r, f))
        one.setdefault("where", []).append(list(r.max_abs_index) if r.max_abs_index is not None else None)
    for f in FIELDS:
        assert all(_same(float(x), float(y)) for x, y in zip(bulk[f], one[f])), f
    assert list(bulk["max_abs_index"]) == one["where"]


@pytest.mark.parametrize("empty", [True, False])
def test_pair_metrics_of_nothing(tmp_path, empty):
    pa, pb = _arms(tmp_path)
    ca, cb = open_capture(pa), open_capture(pb)
    pos = np.zeros(0, dtype=np.int64) if empty else np.array([0])
    out = pair_metrics(ca, cb, pos, pos)
    assert len(out["rel_l2"]) == len(pos)
