import json
import os
import time

import pytest
import torch

from workbench.capture import CaptureWriter, open_capture
from workbench.errors import (ChecksumError, DuplicateKeyError, IncompleteCaptureError, KeyNotFoundError,
                              ShardError, UnsafePathError, WorkbenchError)


@pytest.fixture
def cap_path(tmp_path):
    p = tmp_path / "cap"
    with CaptureWriter(p, arm="control", shard_bytes=2000) as w:
        for step in range(3):
            for layer in range(4):
                w.add(torch.full((8, 16), layer * 10.0 + step).bfloat16(), step=step, layer=layer,
                      op="mlp", name="output", kind="act")
                w.add(torch.full((5,), float(layer)), step=step, layer=layer, op="gdn", name="g")
        w.add(torch.tensor(7), step=2, op="sampler", name="token")
    return p


def test_select_get_and_views(cap_path):
    cap = open_capture(cap_path)
    assert len(cap.select(op="mlp")) == 12
    assert len(cap.select(layer=slice(1, 3), op=["mlp", "gdn"])) == 12
    assert len(cap.select(step=lambda s: s > 0, op="gdn")) == 8
    assert len(cap.select(tag_kind="act")) == 12
    assert cap.get(op="sampler").item() == 7
    t = cap.get(step=1, layer=2, op="mlp", name="output")
    assert t.dtype == torch.bfloat16 and t[0, 0].item() == 21.0
    with pytest.raises(KeyNotFoundError, match="12 tensors match"):
        cap.get(op="mlp")
    with pytest.raises(KeyNotFoundError, match="no tensor matches"):
        cap.get(op="mlp", layer=9, step=0)
    with pytest.raises(KeyNotFoundError, match="unknown filter"):
        cap.select(lyr=1)
    summary = cap.summary()
    assert summary.set_index("op").loc["mlp", "tensors"] == 12


def test_get_is_copy_on_write(cap_path):
    cap = open_capture(cap_path)
    t = cap.get(step=0, layer=0, op="gdn", name="g")
    t += 1
    assert open_capture(cap_path).get(step=0, layer=0, op="gdn", name="g").sum() == 0


def test_to_xarray_is_lazy_and_correct(cap_path, monkeypatch):
    cap = open_capture(cap_path)
    da = cap.to_xarray(("layer", "step"), op="mlp", name="output")
    assert da.dims == ("layer", "step", "dim_0", "dim_1") and da.shape == (4, 3, 8, 16)
    reads = []
    orig = type(cap)._tensor
    monkeypatch.setattr(type(cap), "_tensor", lambda self, row: reads.append(1) or orig(self, row))
    assert float(da.sel(layer=2, step=1)[0, 0]) == 21.0
    assert len(reads) == 1  # only the tensor indexed was read
    assert float(da.mean()) == pytest.approx(sum(l * 10 + s for l in range(4) for s in range(3)) / 12)
    with pytest.raises(WorkbenchError, match="varies along"):
        cap.to_xarray(("layer",), op="mlp", name="output")
    with pytest.raises(WorkbenchError, match="different shapes"):
        cap.to_xarray(("layer", "step", "op", "name"), name=["output", "g"], op=["mlp", "gdn"])


def test_verify_ok_and_detects_corruption(cap_path):
    cap = open_capture(cap_path)
    assert cap.verify().ok
    shard = cap_path / cap.shards[1]["path"]
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="sha256") as ei:
        open_capture(cap_path).verify()
    assert str(shard) in str(ei.value) and "re-copy" in str(ei.value)
    report = open_capture(cap_path).verify(raise_on_error=False)
    assert not report.ok and "sha256 mismatch" in str(report)


def test_truncated_and_missing_shards(cap_path):
    cap = open_capture(cap_path)
    row = cap.index.iloc[-1]
    shard = cap_path / cap.shards[int(row["shard"])]["path"]
    shard.write_bytes(shard.read_bytes()[:20])
    with pytest.raises(ShardError, match="truncated") as ei:
        open_capture(cap_path).get(op="sampler")
    assert "key:  rank=0 step=2 layer=-1 op=sampler name=token" in str(ei.value)
    with pytest.raises(ChecksumError, match="size"):
        open_capture(cap_path).verify()
    shard.unlink()
    with pytest.raises(ShardError, match="missing"):
        open_capture(cap_path).get(op="sampler")


def _edit_manifest(p, fn):
    m = json.loads((p / "manifest.json").read_text())
    fn(m)
    (p / "manifest.json").write_text(json.dumps(m))


def test_manifest_errors(cap_path, tmp_path):
    with pytest.raises(IncompleteCaptureError, match="does not exist"):
        open_capture(tmp_path / "nope")
    _edit_manifest(cap_path, lambda m: m["shards"][0].__setitem__("path", "../../etc/passwd"))
    with pytest.raises(UnsafePathError, match="leaves the capture directory"):
        open_capture(cap_path)
    _edit_manifest(cap_path, lambda m: m["shards"][0].__setitem__("path", "shard-00000.safetensors"))
    _edit_manifest(cap_path, lambda m: m["tensors"]["name"].__setitem__(1, m["tensors"]["name"][0]) or
                   m["tensors"]["op"].__setitem__(1, m["tensors"]["op"][0]) or
                   m["tensors"]["layer"].__setitem__(1, m["tensors"]["layer"][0]))
    with pytest.raises(DuplicateKeyError, match="duplicate keys"):
        open_capture(cap_path)


def test_symlinked_shard_outside_is_refused(cap_path, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    shard = cap_path / "shard-00000.safetensors"
    outside.write_bytes(shard.read_bytes())
    shard.unlink()
    os.symlink(outside, shard)
    with pytest.raises(UnsafePathError, match="symlink"):
        open_capture(cap_path)


def test_opening_100k_tensors_is_fast(tmp_path):
    p = tmp_path / "big"
    with CaptureWriter(p, arm="a") as w:
        for i in range(100_000):
            w.add(torch.zeros(()), step=i // 100, layer=i % 100, op="o", name="n")
    t0 = time.perf_counter()
    cap = open_capture(p)
    elapsed = time.perf_counter() - t0
    assert len(cap) == 100_000
    assert elapsed < 1.5, f"opening took {elapsed:.2f}s"  # generous on a loaded 2-core CI box
