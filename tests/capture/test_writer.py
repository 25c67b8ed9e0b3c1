import errno
import json
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors import safe_open

from workbench.capture import CaptureWriter, open_capture
from workbench.capture.writer import MARKER
from workbench.errors import (CaptureError, CaptureLockedError, DiskFullError, DuplicateKeyError,
                              IncompleteCaptureError)

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn,
          torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool]


def test_round_trip_every_dtype_and_shape(tmp_path):
    g = torch.Generator().manual_seed(0)
    made = {}
    with CaptureWriter(tmp_path / "c", arm="control", run={"model": "m"}, shard_bytes=300) as w:
        for i, dt in enumerate(DTYPES):
            for j, shape in enumerate([(), (0,), (3,), (2, 3, 5)]):
                t = (torch.randn(shape, generator=g) * 10).to(dt)
                name = f"{str(dt)[6:]}-{j}"
                w.add(t, layer=i, op="x", name=name, shape_rank=len(shape))
                made[(i, name)] = t
    cap = open_capture(tmp_path / "c")
    assert len(cap) == len(made) and len(cap.shards) > 1
    for (layer, name), t in made.items():
        got = cap.get(layer=layer, op="x", name=name)
        assert got.dtype == t.dtype and got.shape == t.shape
        assert torch.equal(got.view(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    assert cap.index["seq"].tolist() == list(range(len(made)))
    assert cap.index["tags"].iloc[0] == {"shape_rank": 0}


def test_shards_are_valid_safetensors(tmp_path):
    with CaptureWriter(tmp_path / "c", arm="a") as w:
        w.add(torch.arange(6, dtype=torch.float32).view(2, 3), op="o", name="n")
        w.add(torch.ones(4, dtype=torch.bfloat16), op="o", name="m")
    with safe_open(str(tmp_path / "c" / "shard-00000.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("t0"), torch.arange(6, dtype=torch.float32).view(2, 3))
        assert f.get_tensor("t1").dtype == torch.bfloat16


def test_exception_inside_block_leaves_no_manifest(tmp_path):
    with pytest.raises(RuntimeError):
        with CaptureWriter(tmp_path / "c", arm="a", shard_bytes=8) as w:
            w.add(torch.ones(4), op="o", name="n")  # flushed to a shard already
            raise RuntimeError("model crashed")
    assert not (tmp_path / "c" / "manifest.json").exists()
    with pytest.raises(IncompleteCaptureError, match="no manifest.json .1 shard"):
        open_capture(tmp_path / "c")


def test_writer_copies_tensors_at_add_time(tmp_path):
    t = torch.zeros(4)
    with CaptureWriter(tmp_path / "c", arm="a") as w:
        w.add(t, op="o", name="n")
        t += 1  # a model overwriting its buffer after the hook
    assert open_capture(tmp_path / "c").get(name="n").sum() == 0


def test_memory_is_bounded_by_shard_size(tmp_path):
    with CaptureWriter(tmp_path / "c", arm="a", shard_bytes=1 << 12) as w:
        for i in range(64):
            w.add(torch.ones(1024), step=i, op="o", name="n")
            assert w._buffered < (1 << 12) + 4096
    assert len(open_capture(tmp_path / "c").shards) == 64


def test_duplicate_key_and_bad_keys(tmp_path):
    with CaptureWriter(tmp_path / "c", arm="a") as w:
        w.add(torch.ones(1), op="o", name="n")
        with pytest.raises(DuplicateKeyError, match="already added") as ei:
            w.add(torch.ones(1), op="o", name="n")
        assert "name='output.1'" in str(ei.value)
        with pytest.raises(CaptureError, match="layer must be an int >= -1"):
            w.add(torch.ones(1), layer=-2, op="o", name="m")
        with pytest.raises(CaptureError, match="op must be a non-empty string"):
            w.add(torch.ones(1), op="", name="m")
        with pytest.raises(CaptureError, match="tag 'x'"):
            w.add(torch.ones(1), op="o", name="m", x=[1])
        with pytest.raises(CaptureError, match="tensors or numpy arrays"):
            w.add([1.0], op="o", name="m")
        w.add(np.arange(3, dtype=np.int32), op="o", name="np")
    assert open_capture(tmp_path / "c").get(name="np").tolist() == [0, 1, 2]


def test_refuses_to_clobber(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    with pytest.raises(CaptureError, match="not empty"):
        CaptureWriter(tmp_path / "c", arm="a")
    with pytest.raises(CaptureError, match="does not look like a capture"):
        CaptureWriter(tmp_path / "c", arm="a", overwrite=True)
    assert (tmp_path / "c" / "notes.txt").read_text() == "mine"
    with CaptureWriter(tmp_path / "d", arm="a") as w:
        w.add(torch.ones(1), op="o", name="n")
    with CaptureWriter(tmp_path / "d", arm="b", overwrite=True) as w:
        w.add(torch.zeros(2), op="o", name="m")
    assert open_capture(tmp_path / "d").arm == "b"


def test_run_metadata_must_be_json(tmp_path):
    with pytest.raises(CaptureError, match="JSON-serializable"):
        CaptureWriter(tmp_path / "c", arm="a", run={"x": object()})


def test_manifest_is_columnar_and_complete(tmp_path):
    with CaptureWriter(tmp_path / "c", arm="a", run={"k": 1}) as w:
        w.add(torch.ones(2, 2), rank=1, step=2, layer=3, op="o", name="n", t="v")
    m = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert m["format"] == "workbench-capture" and m["version"] == 1 and m["count"] == 1
    assert m["tensors"]["shape"] == [[2, 2]] and m["tensors"]["dtype"] == ["fp32"]
    assert len(m["shards"][0]["sha256"]) == 64


# -- nothing a user wrote is lost -------------------------------------------------------------

def _capture(path, arm="old", n=3):
    with CaptureWriter(path, arm=arm) as w:
        for i in range(n):
            w.add(torch.full((4,), float(i)), step=i, op="o", name="n")
    return path


@pytest.mark.parametrize("files", [
    {".ssh/id_ed25519": "key"}, {".git/HEAD": "ref"}, {"model.safetensors": "weights"},
    {"config.json": "{}", "model.safetensors": "w"}, {"part.tmp": "x"}, {"notes.txt": "mine"},
], ids=["dotdir-ssh", "dotdir-git", "safetensors-only", "hf-model-folder", "tmp-only", "text"])
def test_overwrite_refuses_what_is_not_a_capture(tmp_path, files):
    d = tmp_path / "d"
    for rel, text in files.items():
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_text(text)
    with pytest.raises(CaptureError, match="does not look like a capture") as e:
        CaptureWriter(d, arm="a", overwrite=True)
    assert str(d) in str(e.value)
    for rel, text in files.items():
        assert (d / rel).read_text() == text
    assert not list(tmp_path.glob(".d.wb-*"))  # no lock or staging left behind


def test_overwrite_refuses_a_capture_with_foreign_files(tmp_path):
    d = _capture(tmp_path / "d")
    (d / "notes.txt").write_text("mine")
    with pytest.raises(CaptureError, match="notes.txt"):
        CaptureWriter(d, arm="a", overwrite=True)
    assert (d / "notes.txt").read_text() == "mine" and open_capture(d).arm == "old"


def test_overwrite_keeps_the_old_capture_until_close(tmp_path):
    d = _capture(tmp_path / "d")
    w = CaptureWriter(d, arm="new", overwrite=True, shard_bytes=8)
    w.add(torch.ones(16), op="o", name="fresh")  # flushed to a shard: written, not committed
    old = open_capture(d)
    assert old.arm == "old" and old.verify().ok and len(old) == 3
    w.close()
    new = open_capture(d)
    assert new.arm == "new" and new.keys() == [(0, 0, -1, "o", "fresh")] and new.verify().ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]  # old copy, staging and lock removed


def test_an_exception_while_overwriting_leaves_the_old_capture(tmp_path):
    d = _capture(tmp_path / "d")
    with pytest.raises(RuntimeError):
        with CaptureWriter(d, arm="new", overwrite=True) as w:
            w.add(torch.ones(2), op="o", name="x")
            raise RuntimeError("model crashed")
    assert open_capture(d).arm == "old" and open_capture(d).verify().ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]


def test_an_incomplete_capture_of_ours_may_be_overwritten(tmp_path):
    d = tmp_path / "d"
    w = CaptureWriter(d, arm="a", shard_bytes=8)
    w.add(torch.ones(4), op="o", name="x")
    w.abort()
    assert (d / MARKER).exists() and not (d / "manifest.json").exists()
    with CaptureWriter(d, arm="b", overwrite=True) as w:
        w.add(torch.zeros(1), op="o", name="y")
    assert open_capture(d).arm == "b"


_KILLED_WRITER = """
import os, signal, sys, torch
from workbench.capture.writer import CaptureWriter
w = CaptureWriter(sys.argv[1], arm="new", overwrite=True, shard_bytes=8)
w.add(torch.ones(64), op="o", name="x")
print("flushed", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_sigkill_while_overwriting_leaves_the_old_capture(tmp_path):
    d = _capture(tmp_path / "d")
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(d)], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL and "flushed" in proc.stdout, proc.stderr
    assert open_capture(d).arm == "old" and open_capture(d).verify().ok
    with CaptureWriter(d, arm="next", overwrite=True) as w:  # the dead writer's staging is cleaned up
        w.add(torch.ones(1), op="o", name="n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and open_capture(d).arm == "next"


def test_two_writers_on_one_directory(tmp_path):
    d = tmp_path / "d"
    w1 = CaptureWriter(d, arm="a")
    with pytest.raises(CaptureLockedError, match="another CaptureWriter"):
        CaptureWriter(d, arm="b")
    w1.add(torch.ones(1), op="o", name="n")
    with pytest.raises(CaptureLockedError):
        CaptureWriter(d, arm="b", overwrite=True)
    code = ("import sys; from workbench.capture.writer import CaptureWriter\n"
            "from workbench.errors import CaptureLockedError\n"
            "try:\n    CaptureWriter(sys.argv[1], arm='c', overwrite=True)\n"
            "except CaptureLockedError:\n    sys.exit(7)\n")
    assert subprocess.run([sys.executable, "-c", code, str(d)]).returncode == 7  # another process
    w1.close()
    assert open_capture(d).arm == "a"
    with CaptureWriter(d, arm="b", overwrite=True) as w2:  # the lock went with close()
        w2.add(torch.ones(1), op="o", name="n")
    assert open_capture(d).arm == "b"


def test_non_finite_tags_are_refused_at_add_and_nothing_is_lost(tmp_path):
    with CaptureWriter(tmp_path / "c", arm="a") as w:
        w.add(torch.ones(1), op="o", name="kept", scale=0.5)
        for bad in (float("nan"), float("inf"), -float("inf")):
            with pytest.raises(CaptureError, match="tag 'scale'.*NaN or Inf"):
                w.add(torch.ones(1), op="o", name="m", scale=bad)
        with pytest.raises(CaptureError, match="Unicode"):
            w.add(torch.ones(1), op="o\ud800", name="m")
        w.add(torch.ones(1), op="o", name="m", tensor="x")  # a tag may be called 'tensor'
    cap = open_capture(tmp_path / "c")
    assert [k[-1] for k in cap.keys()] == ["kept", "m"] and cap.index["tags"][1] == {"tensor": "x"}


class _FullDisk:
    def __init__(self, path, room):
        self.f, self.room = open(path, "wb"), room

    def write(self, b):
        n = len(memoryview(b).cast("B"))
        if n > self.room:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.f.name))
        self.room -= n
        return self.f.write(b)

    def __getattr__(self, k):
        return getattr(self.f, k)

    def __enter__(self):
        return self

    def __exit__(self, *a):
        self.f.close()


def test_a_full_disk_is_a_typed_error_and_leaves_no_partial_files(tmp_path, monkeypatch):
    import workbench.capture.writer as writer_mod

    d = _capture(tmp_path / "d")
    monkeypatch.setattr(writer_mod, "_open_shard", lambda p: _FullDisk(p, room=100))
    with pytest.raises(DiskFullError) as e:
        with CaptureWriter(d, arm="new", overwrite=True) as w:
            w.add(torch.ones(1000), op="o", name="big")
    msg = str(e.value)
    assert "no space left" in msg and "bytes free" in msg and "tensor bytes written" in msg and "fix:" in msg
    assert open_capture(d).arm == "old" and open_capture(d).verify().ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"]
    assert not list(d.glob("*.tmp"))
    fresh = tmp_path / "fresh"
    with pytest.raises(DiskFullError):
        with CaptureWriter(fresh, arm="new") as w:
            w.add(torch.ones(1000), op="o", name="big")
    assert not list(fresh.glob("*.tmp"))  # an incomplete capture of ours, no half shard


def test_manifest_is_committed_atomically(tmp_path, monkeypatch):
    import workbench.capture.format as fmt

    def half_then_crash(obj, f, **kw):
        f.write(json.dumps(obj)[:40])
        f.flush()
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(fmt.json, "dump", half_then_crash)
    with pytest.raises(CaptureError):
        with CaptureWriter(tmp_path / "c", arm="a") as w:
            w.add(torch.ones(2), op="o", name="n")
    # a crash while writing the manifest leaves none (not half of one) and no temporary file
    assert not (tmp_path / "c" / "manifest.json").exists()
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".manifest")]
    with pytest.raises(IncompleteCaptureError):
        open_capture(tmp_path / "c")
