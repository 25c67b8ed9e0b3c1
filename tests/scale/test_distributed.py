"""compare_captures, verify and replay on a dask.distributed LocalCluster of 2 worker processes:
the same results as a local run, a worker killed mid-comparison, an unreachable scheduler."""

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

distributed = pytest.importorskip("distributed")

from workbench.analysis.compare import compare_captures  # noqa: E402
from workbench.analysis.distributed import _set_delay, connect, partitions  # noqa: E402
from workbench.analysis.replay import replay  # noqa: E402
from workbench.capture import open_capture  # noqa: E402
from workbench.errors import ClusterError  # noqa: E402

CAPTURES = Path(__file__).resolve().parents[2] / "captures"


@pytest.fixture(scope="module")
def client():
    c = connect(workers=2)
    assert len(c.scheduler_info()["workers"]) == 2
    yield c
    cluster = c.cluster
    c.close()
    cluster.close()


def _same(a, b):
    pd.testing.assert_frame_equal(a.table, b.table)
    fa, fb = a.first_divergence(), b.first_divergence()
    assert (fa is None) == (fb is None)
    if fa is not None:
        assert fa.equals(fb)


def test_cluster_result_is_the_local_one(client):
    ctl, cand, aa = (CAPTURES / n for n in ("control", "candidate", "control-repeat"))
    local = compare_captures(ctl, cand, aa=aa)
    dist = compare_captures(ctl, cand, aa=aa, client=client)
    _same(local, dist)
    assert local.first_divergence() is not None  # the bundled candidate diverges: a finding to agree on
    by_shard = compare_captures(ctl, cand, aa=aa, client=client, partition="shard")
    _same(local, by_shard)


def test_logical_comparison_on_the_cluster(client):
    # another layout (TP1 against the TP4 hybrid capture): logical views travel to the workers
    ctl, cand = CAPTURES / "hf-qwen3next-control", CAPTURES / "hf-qwen3next-candidate"
    local = compare_captures(ctl, cand, grouping="logical")
    dist = compare_captures(ctl, cand, grouping="logical", client=client)
    _same(local, dist)
    pd.testing.assert_frame_equal(local.replicas, dist.replicas)  # found on the workers, reported here
    assert local.layout_notes == dist.layout_notes


def test_a_killed_worker_loses_nothing(client):
    ctl, cand = CAPTURES / "control", CAPTURES / "candidate"
    local = compare_captures(ctl, cand)
    client.run(_set_delay, 0.4)  # every task sleeps: the kill lands while tasks run
    try:
        pids = client.run(os.getpid)
        box = {}
        t = threading.Thread(target=lambda: box.setdefault("res", compare_captures(ctl, cand, client=client)))
        t.start()
        deadline = time.time() + 30
        while not client.processing() or not any(client.processing().values()):
            assert time.time() < deadline, "no task started"
            time.sleep(0.05)
        time.sleep(0.3)
        victim = sorted(pids)[0]
        os.kill(pids[victim], signal.SIGKILL)
        t.join(timeout=180)
        assert not t.is_alive(), "the comparison did not finish after a worker died"
        _same(local, box["res"])
        # the nanny brought a worker back
        client.wait_for_workers(2, timeout=60)
        assert pids[victim] not in client.run(os.getpid).values()
    finally:
        client.run(_set_delay, 0.0)


def test_verify_on_the_cluster(client, tmp_path):
    import shutil

    dst = tmp_path / "cap"
    shutil.copytree(CAPTURES / "control", dst)
    cap = open_capture(dst)
    pd.testing.assert_frame_equal(cap.verify(client=client).shards, cap.verify().shards)
    shard = dst / cap.shards[-1]["path"]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    rep = open_capture(dst).verify(raise_on_error=False, client=client)
    assert not rep.ok and rep.shards["status"].iloc[-1] == "sha256 mismatch"
    assert (rep.shards["status"].iloc[:-1] == "ok").all()


def test_replay_on_the_cluster(client):
    kw = dict(op="gdn", layer=0, max_cases=6, backends=("torch", "oracle"))
    local = replay(CAPTURES / "control", **kw)
    dist = replay(CAPTURES / "control", client=client, **kw)
    xr.testing.assert_identical(local.drop_attrs(), dist.drop_attrs())
    assert local.attrs["skipped"] == dist.attrs["skipped"]
    # device="auto" is resolved on each worker (its GPU, else its CPU): the same dataset here;
    # each worker's kernel timings come back merged, one record per op and backend
    on_dev = replay(CAPTURES / "control", client=client, device="auto", **kw)
    xr.testing.assert_identical(local.drop_attrs(), on_dev.drop_attrs())
    import json
    t = {(r["backend"], r["op"]): r for r in json.loads(on_dev.attrs["timings"])}
    assert t[("torch", "recurrent")]["calls"] == 6 and on_dev.attrs["device"] == "auto"


def test_unreachable_scheduler_is_a_clear_error():
    with pytest.raises(ClusterError, match="cannot reach the dask scheduler at 'tcp://127.0.0.1:9'") as ei:
        connect("tcp://127.0.0.1:9", timeout=2)
    assert "--scheduler" in str(ei.value) and "fix" in str(ei.value)


def test_unreachable_scheduler_on_the_cli_exits_2(capsys):
    from workbench.cli import main

    rc = main(["compare", str(CAPTURES / "control"), str(CAPTURES / "candidate"), "--scheduler", "tcp://127.0.0.1:9"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "cannot reach the dask scheduler" in err


def test_partitions_group_keys_in_order():
    cap = open_capture(CAPTURES / "control")
    pos = np.arange(len(cap))
    parts = partitions(cap.index, pos)
    assert sorted(np.concatenate(parts).tolist()) == pos.tolist()
    for p in parts:
        assert len(cap.index.iloc[p][["rank", "step"]].drop_duplicates()) == 1
    with pytest.raises(ClusterError, match="cannot partition by"):
        partitions(cap.index, pos, "nope")


def test_replicas_found_on_the_workers_are_reported(client, tmp_path):
    import torch

    from workbench.capture import CaptureWriter

    x = torch.ones(2, 4)
    with CaptureWriter(tmp_path / "a", arm="a") as w:
        for s in range(3):
            w.add(x, step=s, op="norm", name="out", dims="t h # tp:replicated")
    with CaptureWriter(tmp_path / "b", arm="b") as w:
        for s in range(3):
            for r in range(4):
                w.add(x + (r == 2 and s == 1), step=s, rank=r, op="norm", name="out", dims="t h # tp:replicated",
                      tp_rank=r, tp_size=4)
    local = compare_captures(tmp_path / "a", tmp_path / "b")
    dist = compare_captures(tmp_path / "a", tmp_path / "b", client=client, partition="step")
    _same(local, dist)
    assert dist.describe_replicas() == local.describe_replicas() == [
        "b: step 1, layer -1, norm/out: rank 2 (tp 2) differs from its replicas by up to 1.000e+00"]
