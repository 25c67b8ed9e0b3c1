"""SGLang's other dump, --debug-tensor-dump-output-folder (tests/fixtures/sglang_hooks: written by
SGLang 0.5.23's own tensor_dump_forward_hook.py, scripts/make_sglang_hook_fixtures.py): one
Pass<k>.pt per forward pass and rank, holding module outputs; the root module's output and the
logits land in the next pass's file."""

import shutil
from pathlib import Path

import pytest
import torch

from workbench.analysis import compare_captures
from workbench.capture import open_capture
from workbench.capture.importers import import_capture
from workbench.errors import ImporterError, UnsafeFileError

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sglang_hooks"


@pytest.fixture(scope="module")
def caps(tmp_path_factory):
    d = tmp_path_factory.mktemp("hooks")
    return {n: import_capture("sglang", FIX / n, d / n) for n in ("control", "candidate")}


def test_module_paths_become_layer_and_op(caps):
    cap = caps["control"]
    idx = cap.index
    assert cap.run["importer"]["layout"] == "forward hooks" and cap.run["parallel"] == {"tp_size": 1, "pp_size": 1}
    assert sorted(idx["step"].unique()) == [0, 1, 2]
    down = cap.select(op="mlp.down_proj", name="output").index
    assert sorted(down["layer"].unique()) == [0, 1]
    assert cap.get(step=0, layer=0, op="mlp.down_proj").shape == (5, 16)  # the 5-token prefill
    assert cap.get(step=1, layer=0, op="mlp.down_proj").shape == (1, 16)
    tags = down["tags"].iloc[0]
    assert (tags["tp_rank"], tags["pp_rank"], tags["module"]) == (0, 0, "model.layers.0.mlp.down_proj")
    assert cap.get(step=0, op="forward_batch_info", name="positions").tolist() == [0, 1, 2, 3, 4]


def test_root_output_and_logits_go_back_to_their_pass(caps):
    """Pass00001.pt holds pass 0's final hidden states ([5, 16]) and logits: they are step 0's."""
    cap = caps["control"]
    out = cap.select(op="model", name="output").index
    assert sorted(out["step"]) == [0, 1] and set(out["tags"].map(lambda t: t["pass_file"])) == {1, 2}
    hidden = cap.get(step=0, op="model", name="output")
    assert hidden.shape == (5, 16)
    assert torch.equal(hidden, cap.get(step=0, op="model.norm", name="output"))  # the root returns model.norm's output
    assert cap.get(step=0, op="logits_processor", name="output").shape == (1, 64)
    # the token the logits pick is the next pass's input
    tok = int(cap.get(step=0, op="logits_processor", name="output").argmax())
    assert cap.get(step=1, op="forward_batch_info", name="input_ids").tolist() == [tok]
    # causal order: a step's own modules, then its root output and logits
    s0 = cap.index[(cap.index["step"] == 0) & (cap.index["op"] != "batch")]
    assert s0["op"].tolist()[-2:] == ["model", "logits_processor"]


def test_planted_fault_found_and_rows_align(caps):
    res = compare_captures(caps["control"], caps["candidate"])
    fd = res.first_divergence()
    assert (fd["step"], fd["layer"], fd["op"], fd["name"]) == (0, 1, "mlp.down_proj", "output")
    assert res.align == "tokens"  # one request per pass: rows carry its positions
    assert caps["control"].run["requests"] == ["request-0"]


def test_mixed_and_bad_files(tmp_path):
    src = tmp_path / "dump"
    shutil.copytree(FIX / "control", src)
    rank_dir = next(p for p in src.iterdir() if p.is_dir())
    torch.save([1, 2], rank_dir / "Pass00003.pt")  # not a dict of module outputs
    with pytest.raises(UnsafeFileError, match="not a dict"):
        import_capture("sglang", src, tmp_path / "a")
    cap = import_capture("sglang", src, tmp_path / "b", on_error="skip")
    assert cap.run["importer"]["skipped"]["count"] == 1
    (rank_dir / "Pass00003.pt").unlink()
    torch.save({"value": torch.ones(2)}, src / "step=0___rank=0___name=x.pt")
    with pytest.raises(ImporterError, match="mixes forward-hook pass files"):
        import_capture("sglang", src, tmp_path / "c")
