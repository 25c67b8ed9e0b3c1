"""The flashinfer importer on dumps written by FlashInfer 0.7.4's own api_logging.py
(tests/fixtures/flashinfer, made by scripts/make_flashinfer_fixtures.py): level-10 call folders in
both tensor formats, a planted bf16 output in layer 1's attention, and two processes."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from workbench.analysis import Rule, compare_captures
from workbench.capture import open_capture
from workbench.capture.importers import import_capture
from workbench.capture.importers.flashinfer import signature_names, tensor_name
from workbench.cli import main
from workbench.errors import ImporterError, UnsafeFileError

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "flashinfer"
RUN = "BatchDecodeWithPagedKVCacheWrapper.run"


@pytest.fixture(scope="module")
def caps(tmp_path_factory):
    d = tmp_path_factory.mktemp("fi")
    return {name: import_capture("flashinfer", FIX / name, d / name.replace("/", "-"))
            for name in ("pt/control", "pt/candidate", "safetensors/control", "pt/tp2")}


def test_calls_become_keys(caps):
    cap = caps["pt/control"]
    idx = cap.index
    # plan() marks the steps (prefill + 2 decode steps); run() once per layer; rmsnorm per layer + final
    assert cap.run["importer"]["step_marker"] == "BatchDecodeWithPagedKVCacheWrapper.plan"
    assert sorted(idx["step"].unique()) == [0, 1, 2]
    assert sorted(idx[idx["op"] == RUN]["layer"].unique()) == [0, 1]
    assert sorted(idx[idx["op"] == "rmsnorm"]["layer"].unique()) == [0, 1, 2]
    assert set(idx[idx["op"] == "top_k_sampling_from_probs"]["layer"]) == {-1}
    names = set(idx[idx["op"] == RUN]["name"])
    assert names == {"input.q", "input.paged_kv_cache.0", "input.paged_kv_cache.1", "output.0", "output.1"}
    # the plan call holds no tensor; every call's scalar arguments are tags
    assert not (idx["op"] == "BatchDecodeWithPagedKVCacheWrapper.plan").any()
    tags = cap.select(op=RUN).index["tags"].iloc[0]
    assert tags["arg.return_lse"] is True and tags["status"] == "completed" and isinstance(tags["pid"], int)
    # causal order: within step 0, layer 0's norm, then its attention, then layer 1's
    s0 = idx[idx["step"] == 0]
    order = list(dict.fromkeys(zip(s0["op"], s0["layer"])))
    assert order[:4] == [("rmsnorm", 0), (RUN, 0), ("rmsnorm", 1), (RUN, 1)]
    q = cap.get(step=0, layer=0, op=RUN, name="input.q")
    assert q.shape == (4, 2, 8) and q.dtype == torch.float32  # the 4-token prefill, 2 heads of 8


def test_formats_agree_and_the_planted_fault_is_found(caps):
    same = compare_captures(caps["pt/control"], caps["safetensors/control"], rules=[Rule("*", threshold=0.0)])
    assert same.first_divergence() is None and same.same_keys
    res = compare_captures(caps["pt/control"], caps["pt/candidate"])
    fd = res.first_divergence()
    assert (fd["step"], fd["layer"], fd["op"], fd["name"]) == (0, 1, RUN, "output.0")
    exact = compare_captures(caps["pt/control"], caps["pt/candidate"], rules=[Rule("*", threshold=0.0)])
    assert exact.first_divergence()["name"] == "output.0"  # its inputs are still bit-identical


def test_processes_are_ranks(caps):
    cap = caps["pt/tp2"]
    assert sorted(cap.index["rank"].unique()) == [0, 1]
    pids = cap.run["importer"]["processes"]
    assert sorted(pids.values()) == [0, 1]
    for r in (0, 1):
        mine = cap.select(rank=r).index
        assert set(mine["tags"].map(lambda t: t["pid"])) == {int(p) for p, rr in pids.items() if rr == r}
        assert cap.get(rank=r, step=0, layer=0, op=RUN, name="input.q").shape == (4, 1, 8)  # one head each


def test_layers_without_a_step_marker(tmp_path):
    cap = import_capture("flashinfer", FIX / "pt/control", tmp_path / "c", step_from="none", layers=2,
                         include="*.run")
    idx = cap.index
    assert set(idx["op"]) == {RUN} and sorted(idx["layer"].unique()) == [0, 1]
    assert sorted(idx["step"].unique()) == [0, 1, 2]
    plain = import_capture("flashinfer", FIX / "pt/control", tmp_path / "p", step_from="none", exclude="rmsnorm")
    assert set(plain.index["layer"]) == {-1} and "rmsnorm" not in set(plain.index["op"])
    with pytest.raises(ImporterError, match="matches no function"):
        import_capture("flashinfer", FIX / "pt/control", tmp_path / "x", step_from="nothing*")


def test_signature_and_tensor_names():
    sig = "(self, q: torch.Tensor, kv: Tuple[torch.Tensor, torch.Tensor] = (1, 2), *, scale: float = 1.0, out=None) -> Tuple[int, str]"
    params = signature_names(sig)
    assert params == ["self", "q", "kv", "scale", "out"]
    assert tensor_name("arg_1", params, "inputs") == "input.q"
    assert tensor_name("arg_2__1", params, "inputs") == "input.kv.1"
    assert tensor_name("arg_9", params, "inputs") == "input.arg9"
    assert tensor_name("kwarg_out", params, "inputs") == "input.out"
    assert tensor_name("result", params, "outputs") == "output"
    assert tensor_name("result_1", params, "outputs") == "output.1"


def test_bad_calls_are_named_or_skipped(tmp_path):
    src = tmp_path / "dump"
    shutil.copytree(FIX / "pt/control", src)
    calls = sorted(p for p in src.iterdir() if p.is_dir())
    (calls[1] / "metadata.jsonl").write_text('{"function_name": "rmsnorm", "call_seq')  # cut while writing
    with pytest.raises(ImporterError, match="not JSON") as e:
        import_capture("flashinfer", src, tmp_path / "a")
    assert "metadata.jsonl" in str(e.value.file)
    (calls[1] / "metadata.jsonl").unlink()  # a folder without metadata is not a call: ignored
    bad = next(p for p in calls if "run_call0002" in p.name)
    torch.save({"x": {"nested": object.__name__}}, bad / "inputs.pt")  # not a dict of tensors
    with pytest.raises(UnsafeFileError, match="not a tensor"):
        import_capture("flashinfer", src, tmp_path / "b")
    cap = import_capture("flashinfer", src, tmp_path / "c", on_error="skip")
    skipped = cap.run["importer"]["skipped"]
    assert skipped["count"] == 1 and "run_call0002" in skipped["files"][0]["file"]
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # nothing half-written


def test_cli_lists_kinds_and_imports(tmp_path, capsys):
    assert main(["import", "--list"]) == 0
    out = capsys.readouterr().out
    assert "flashinfer" in out and "step_from" in out and "sglang" in out
    assert main(["import", "flashinfer", str(FIX / "pt/control"), str(tmp_path / "c"), "-o", "layers=2",
                 "-o", "step_from=none"]) == 0
    assert sorted(open_capture(tmp_path / "c").index["layer"].unique()) == [0, 1]
    assert main(["import", "flashinfer"]) == 2
    assert main(["import", "flashinfer", str(tmp_path / "missing"), str(tmp_path / "d")]) == 2


def test_graph_flushes_are_replays(tmp_path):
    """A call captured in a CUDA graph is written at each replay's flush, as api_logging's
    _flush_graph_dumps lays it out: <call>/graph_flushes/flush_<NNNN>/{inputs,outputs}.pt (and the
    latest copy at the top, which is not imported twice). Flush k follows the 3 eager steps: step
    3 + k - 1."""
    src = tmp_path / "dump"
    shutil.copytree(FIX / "pt/control", src)
    call = next(p for p in sorted(src.iterdir()) if p.name.endswith("top_k_sampling_from_probs_call0001"))
    for k in (1, 2, 3):
        snap = call / "graph_flushes" / f"flush_{k:04d}"
        snap.mkdir(parents=True)
        torch.save({"arg_0": torch.full((1, 32), float(k))}, snap / "inputs.pt")
        torch.save({"result": torch.tensor([k])}, snap / "outputs.pt")
        (snap / "metadata.jsonl").write_text((call / "metadata.jsonl").read_text())
    cap = import_capture("flashinfer", src, tmp_path / "c")
    out = cap.select(op="top_k_sampling_from_probs", name="output").index
    rows = out[out["tags"].map(lambda t: "graph_flush" in t)]
    assert sorted(rows["step"]) == [3, 4, 5] and sorted(rows["tags"].map(lambda t: t["graph_flush"])) == [1, 2, 3]
    for k in (1, 2, 3):
        assert cap.get(step=2 + k, op="top_k_sampling_from_probs", name="output").tolist() == [k]
    # the eager calls keep their steps; the captured call's own eager copy is gone (it is the flushes)
    eager = out[out["tags"].map(lambda t: "graph_flush" not in t)]
    assert sorted(eager["step"]) == [1, 2]
