import json

import numpy as np
import pytest
import torch
from safetensors import safe_open

from workbench.capture import CaptureWriter, open_capture
from workbench.errors import CaptureError, DuplicateKeyError, IncompleteCaptureError

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
