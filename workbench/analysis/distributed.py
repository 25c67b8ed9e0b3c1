"""The comparison, verification and replay spread over a dask.distributed cluster.

Nothing here schedules work itself: dask.distributed does (task placement, retries when a
worker dies, work stealing). This module decides what one task is and puts the results back in
order, so that a distributed run gives the table a local run gives, row for row:

- :func:`connect`: a ``Client`` for ``--scheduler ADDRESS`` or a ``LocalCluster`` of
  ``--workers N`` processes, with a typed error when the scheduler cannot be reached;
- :func:`pair_metrics_on`: :func:`workbench.analysis.compare.pair_metrics` in tasks of one
  (rank, step) each (or one control shard each), so each worker maps only the shards of its
  keys; the captures travel once per worker (their manifest and index, never tensor bytes) and
  every worker must see the capture files at the same path (a shared filesystem);
- :func:`verify_on`: the sha256 and header check of every shard, one task per shard;
- :func:`replay_on`: replay cases in chunks, each worker running the backends where it is
  (one GPU per worker with dask-cuda's ``LocalCUDACluster``).

See docs/scale.md for cluster recipes (SSH, SLURM through dask-jobqueue, dask-cuda).
"""

from __future__ import annotations

import itertools
from typing import Sequence

import numpy as np

from workbench.errors import ClusterError

__all__ = ["connect", "local_cluster", "pair_metrics_on", "partitions", "verify_on", "replay_on", "PARTITIONS"]

PARTITIONS = ("rank", "step")  # what one comparison task holds by default
_TOKEN = itertools.count()


def _distributed():
    try:
        import distributed
    except ImportError:  # pragma: no cover - a dependency of the workbench
        raise ClusterError("dask.distributed is not installed", key="scheduler",
                           fix="pip install 'distributed>=2024.1' (a dependency of the workbench)") from None
    return distributed


def local_cluster(workers: int, *, threads: int | None = None, gpus: bool = False):
    """A ``LocalCluster`` of ``workers`` processes (``threads`` each: by default the cores
    shared out), or dask-cuda's ``LocalCUDACluster`` (one worker per GPU) with ``gpus``."""
    import os

    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ClusterError(f"workers must be an int >= 1, got {workers!r}", key="--workers",
                           fix="pass --workers N with N >= 1")
    if gpus:
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise ClusterError("gpus=True needs dask-cuda", key="--gpus",
                               fix="pip install dask-cuda (one worker per GPU), or leave --gpus off") from None
        return LocalCUDACluster(n_workers=workers)
    distributed = _distributed()
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    return distributed.LocalCluster(n_workers=workers, threads_per_worker=threads, processes=True,
                                    dashboard_address=None)


def connect(scheduler: str | None = None, *, workers: int | None = None, timeout: float = 10.0,
            gpus: bool = False):
    """A ``distributed.Client``: to the scheduler at ``scheduler`` (e.g. ``tcp://head:8786``), or
    to a new local cluster of ``workers`` processes. Raises ClusterError naming the address and
    the fix when the scheduler does not answer within ``timeout`` seconds."""
    distributed = _distributed()
    if scheduler and workers:
        raise ClusterError("pass either a scheduler address or a number of local workers, not both",
                           key="--scheduler", fix="drop --workers to use the running cluster")
    if scheduler:
        try:
            return distributed.Client(scheduler, timeout=timeout)
        except (OSError, TimeoutError) as e:
            raise ClusterError(f"cannot reach the dask scheduler at {scheduler!r} within {timeout:g} s: {e}",
                               key="--scheduler",
                               fix="start one (dask scheduler; dask worker ADDRESS on each machine), check the "
                                   "address and port, or use --workers N for a local cluster") from None
        except ValueError as e:  # a malformed address
            raise ClusterError(f"bad scheduler address {scheduler!r}: {e}", key="--scheduler",
                               fix="write it as tcp://HOST:PORT") from None
    if workers:
        cluster = local_cluster(workers, gpus=gpus)
        client = distributed.Client(cluster)
        return client
    raise ClusterError("no scheduler and no workers given", key="--scheduler",
                       fix="pass --scheduler tcp://HOST:PORT or --workers N")


def partitions(index, pos: np.ndarray, by: Sequence[str] | str | None = None) -> list[np.ndarray]:
    """The positions ``0..len(pos)-1`` grouped into tasks by the values of ``by`` (key fields,
    or "shard") at index rows ``pos``, in order of first appearance."""
    import pandas as pd

    by = list(PARTITIONS) if by is None else ([by] if isinstance(by, str) else list(by))
    bad = [b for b in by if b not in index.columns]
    if bad:
        raise ClusterError(f"cannot partition by {bad}: not a column of the capture index", key="partition",
                           fix=f"partition by some of {[c for c in ('rank', 'step', 'layer', 'shard') if c in index]}")
    if len(pos) == 0:
        return []
    keys = index[by].to_numpy()[pos] if by else np.zeros((len(pos), 1))
    codes = pd.MultiIndex.from_arrays([keys[:, i] for i in range(keys.shape[1])]).factorize(sort=False)[0] \
        if keys.shape[1] > 1 else pd.factorize(keys[:, 0], sort=False)[0]
    order = np.argsort(codes, kind="stable")
    bounds = np.flatnonzero(np.diff(codes[order])) + 1
    return np.split(order, bounds)


def _n_workers(client) -> int:
    try:
        return max(1, len(client.scheduler_info().get("workers", {})))
    except Exception:  # noqa: BLE001 - an old or odd client: assume one
        return 1


def _coalesce(parts: list[np.ndarray], index, pos: np.ndarray, workers: int, per_worker: int = 4) -> list[np.ndarray]:
    """Neighbouring partitions merged into about ``per_worker`` tasks per worker of similar bytes
    (a task costs tens of milliseconds of scheduling: thousands of tiny (rank, step) groups would
    cost more than their comparison). A partition is never split, so each task still reads only
    the shards of its own keys."""
    if len(parts) <= workers * per_worker:
        return parts
    if "nbytes" in index:
        nb = index["nbytes"].to_numpy()[pos].astype(np.float64)
        sizes = np.array([nb[p].sum() for p in parts]) + 4096.0  # a key costs something even when tiny
    else:
        sizes = np.array([float(len(p)) for p in parts])
    target = sizes.sum() / (workers * per_worker)
    out, cur, acc = [], [], 0.0
    for p, s in zip(parts, sizes):
        cur.append(p)
        acc += s
        if acc >= target:
            out.append(np.concatenate(cur))
            cur, acc = [], 0.0
    if cur:
        out.append(np.concatenate(cur))
    return out


def _pair_task(ca, cb, pos_a, pos_b, dtype, atol, rtol):
    from workbench.analysis.compare import pair_metrics
    from workbench.progress import quiet

    if _DELAY[0]:  # tests: a slow task, so that a worker can be killed while it runs
        import time
        time.sleep(_DELAY[0])
    seen = [len(_found(v)) for v in (ca, cb)]
    with quiet():
        vals = pair_metrics(ca, cb, pos_a, pos_b, dtype=dtype, atol=atol, rtol=rtol)
    # replicated copies that disagree are found as logical tensors are rebuilt: here, on the
    # worker; they go back with the metrics so that the driver's result lists them
    return vals, [list(_found(v)[n:]) for v, n in zip((ca, cb), seen)]


def _found(view) -> list:
    try:
        return view.replicas
    except AttributeError:  # a raw capture rebuilds nothing
        return []


_DELAY = [0.0]


def _set_delay(seconds: float) -> None:
    _DELAY[0] = float(seconds)


def _scatter(client, objs):
    return [client.scatter(o, broadcast=True, hash=False) for o in objs]


def pair_metrics_on(client, ca, cb, pos_a, pos_b, *, dtype=None, atol=1e-5, rtol=1e-3, partition=None):
    """:func:`~workbench.analysis.compare.pair_metrics` on the cluster's workers, one task per
    partition of the control's rows ``pos_a``; the columns come back in the order of ``pos_a``."""
    from workbench.analysis.compare import _empty_values
    from workbench.progress import counter

    distributed = _distributed()
    pos_a = np.asarray(pos_a, dtype=np.int64)
    pos_b = np.asarray(pos_b, dtype=np.int64)
    out = _empty_values(len(pos_a))
    parts = _coalesce(partitions(ca.index, pos_a, partition), ca.index, pos_a, _n_workers(client))
    if not parts:
        return out
    fa, fb = _scatter(client, (ca, cb))
    run = next(_TOKEN)
    futures = {client.submit(_pair_task, fa, fb, pos_a[p], pos_b[p], dtype, atol, rtol, pure=False,
                             key=f"workbench-compare-{run}-{i}"): p for i, p in enumerate(parts)}
    bar = counter(desc="compare (cluster)", unit="task", total=len(parts))
    try:
        for fut, (vals, found) in distributed.as_completed(futures, with_results=True):
            p = futures[fut]
            for view, new in zip((ca, cb), found):
                have = _found(view)
                have.extend(r for r in new if r not in have)
            for f, v in vals.items():
                out[f][p] = v
            bar.update(1)
    finally:
        bar.close()
    return out


def _verify_task(cap, shard: int, chunk: int):
    return cap._verify_shard(shard, chunk)


def verify_on(client, cap, *, chunk: int = 8 << 20) -> list[tuple[dict, Exception | None]]:
    """Each shard's check (:meth:`Capture.verify`) as one task; results in shard order."""
    (fc,) = _scatter(client, (cap,))
    run = next(_TOKEN)
    futs = [client.submit(_verify_task, fc, i, chunk, pure=False, key=f"workbench-verify-{run}-{i}")
            for i in range(len(cap.shards))]
    return client.gather(futs)


def _replay_task(cap, op, capture_op, out, variants, cases, device=None):
    from workbench.analysis.replay import _replay_cases

    return _replay_cases(cap, op, capture_op, out, variants, cases, device=device)


def replay_on(client, cap, op, capture_op, out, variants, cases, *, chunk: int | None = None, device=None):
    """Replay ``cases`` in tasks of ``chunk`` cases (default: spread over the workers); the
    results come back in case order, with the skipped variants and kernel logs of every task.
    ``device`` ("auto", "cuda", ...) is resolved on each worker (its own GPU)."""
    n_workers = _n_workers(client)
    chunk = chunk or max(1, -(-len(cases) // (2 * n_workers)))
    (fc,) = _scatter(client, (cap,))
    run = next(_TOKEN)
    futs = [client.submit(_replay_task, fc, op, capture_op, out, variants, cases[i:i + chunk], device, pure=False,
                          key=f"workbench-replay-{run}-{i}") for i in range(0, len(cases), chunk)]
    return client.gather(futs)
