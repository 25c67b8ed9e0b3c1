"""vLLM's hidden-states connector files (tests/fixtures/vllm_hidden_states: gathered and written by
vLLM 0.33's own example_hidden_states_connector.py from a tiny random HF Llama, made by
scripts/make_vllm_hidden_states_fixtures.py): one <random request id>.safetensors per request with
hidden_states [T, 3 layers, 32]; the candidate's ids and request order differ and its layer 2 MLP
runs in bf16."""

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from workbench.analysis import Rule, compare_captures
from workbench.capture.importers import import_capture
from workbench.cli import main
from workbench.errors import ImporterError

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "vllm_hidden_states"


@pytest.fixture(scope="module")
def caps(tmp_path_factory):
    d = tmp_path_factory.mktemp("vllm")
    return {n: import_capture("vllm-hidden-states", FIX / n, d / n, layers="1,2,3") for n in ("control", "candidate")}


def test_layers_split_and_requests_by_tokens(caps):
    cap = caps["control"]
    idx = cap.index[cap.index["op"] == "hidden_states"]
    assert sorted(idx["layer"].unique()) == [1, 2, 3] and sorted(idx["step"].unique()) == [0, 1]
    lengths = sorted(cap.get(step=s, op="tokens", name="token_ids").shape[0] for s in (0, 1))
    assert lengths == [5, 7]
    assert cap.get(step=0, layer=1, op="hidden_states").shape[1] == 32
    # request ids are random; each request is named by its tokens, the same in both runs
    assert cap.run["requests"] == caps["candidate"].run["requests"]
    other = caps["candidate"].index
    assert {t["request_id"] for t in idx["tags"]}.isdisjoint(
        {t["request_id"] for t in other[other["op"] == "hidden_states"]["tags"]})


def test_the_bf16_layer_is_found(caps):
    exact = compare_captures(caps["control"], caps["candidate"], rules=[Rule("*", threshold=0.0)])
    fd = exact.first_divergence()
    assert (fd["layer"], fd["op"]) == (2, "hidden_states")
    ok = exact.table[(exact.table["layer"] == 1)]
    assert len(ok) == 2 and (ok["rel_l2"] == 0).all()  # layer 1 bit-identical in both requests
    assert exact.align == "tokens"


def test_bad_inputs(tmp_path):
    src = tmp_path / "d"
    shutil.copytree(FIX / "control", src)
    with pytest.raises(ImporterError, match="names 2 layer ids but the file holds 3"):
        import_capture("vllm-hidden-states", src, tmp_path / "a", layers="1,2")
    save_file({"x": torch.ones(2)}, str(src / "other.safetensors"))
    with pytest.raises(ImporterError, match="not hidden_states and token_ids"):
        import_capture("vllm-hidden-states", src, tmp_path / "b")
    cap = import_capture("vllm-hidden-states", src, tmp_path / "c", on_error="skip")
    assert cap.run["importer"]["skipped"]["count"] == 1 and cap.run["importer"]["requests"] == 2
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
    assert main(["import", "vllm-hidden-states", str(FIX / "control"), str(tmp_path / "cli"), "-o", "layers=1,2,3"]) == 0
    assert main(["import", "vllm-hidden-states", str(FIX / "control"), str(tmp_path / "e"), "-o", "layers=9"]) == 2
