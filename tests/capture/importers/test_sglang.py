"""SGLang dumper importer: file names, contents, key mapping, causal order, refusals."""

from __future__ import annotations

import os
import pickle
import string
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from workbench.capture.importers import import_capture
from workbench.capture.importers.sglang import _SPLIT, format_dump_name, parse_dump_name, split_dump_name
from workbench.errors import DuplicateKeyError, FileNameError, ImporterError, UnsafeFileError


def _dump(folder: Path, fields: dict, value, *, wrap: bool = True) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / format_dump_name(fields)
    torch.save({"value": value, "meta": {**fields, "world_size": 2, "nested": {"tp_rank": 0}}} if wrap else value, p)
    return p


@pytest.fixture
def current_dump(tmp_path):
    """Two ranks, two steps, two layers: the current dumper's layout (one folder, rank in the name)."""
    src = tmp_path / "dumper" / "dump_20250101_000000_000001"
    torch.manual_seed(0)
    expected = {}
    for rank in range(2):
        di = 0
        for step in range(2):
            for layer in range(2):
                for name in ("layer_start__hidden_states", f"model.layers.{layer}.self_attn.o_proj.output"):
                    di += 1
                    t = torch.randn(3, 4, dtype=torch.bfloat16)
                    fields = dict(step=step, rank=rank, dump_index=di, name=name,
                                  recompute_status="disabled", layer_id=layer)
                    _dump(src, fields, t)
                    expected[(rank, step, layer, split_dump_name(name, layer)[1])] = t
    return src, expected


def test_current_layout_keys_values_and_order(current_dump, tmp_path):
    src, expected = current_dump
    cap = import_capture("sglang", src, tmp_path / "cap", arm="candidate")
    assert cap.arm == "candidate" and len(cap) == 16
    for (rank, step, layer, op), t in expected.items():
        name = "hidden_states" if op == "layer_start" else "output"
        got = cap.get(rank=rank, step=step, layer=layer, op=op, name=name)
        assert got.dtype == torch.bfloat16 and torch.equal(got, t)
    idx = cap.index
    assert set(idx["op"]) == {"layer_start", "self_attn.o_proj"}
    # causal order: by step, then the dumper's own dump_index, ties across ranks by rank
    di = idx["tags"].map(lambda t: t["dump_index"])
    assert list(zip(idx["step"], di, idx["rank"])) == sorted(zip(idx["step"], di, idx["rank"]))
    tags = idx["tags"].iloc[0]
    assert tags["recompute_status"] == "disabled" and tags["world_size"] == 2
    assert "nested" not in tags  # only scalar meta entries become tags
    assert cap.run["importer"]["kind"] == "sglang" and cap.run["importer"]["imported"] == 16
    assert cap.verify().ok


def test_older_layout_forward_pass_id_rank_folders_and_bare_tensors(tmp_path):
    src = tmp_path / "old"
    for rank in range(2):
        for fpid in (0, 1):
            t = torch.full((2,), float(10 * rank + fpid))
            _dump(src / f"sglang_dump_1712345678.123_{rank}",
                  dict(forward_pass_id=fpid, name="attn_out", layer_id=5), t, wrap=False)
    cap = import_capture("sglang", src, tmp_path / "cap")
    assert sorted(cap.index["rank"].unique()) == [0, 1]
    assert torch.equal(cap.get(rank=1, step=1, layer=5), torch.full((2,), 11.0))
    assert set(cap.index["op"]) == {"attn_out"} and set(cap.index["name"]) == {"value"}


@pytest.mark.parametrize("dumped, layer_id, expected", [
    ("model.layers.3.self_attn.o_proj.output", None, (3, "self_attn.o_proj", "output")),
    ("non_intrusive__model.layers.3.mlp.inputs.0", None, (3, "mlp", "inputs.0")),
    ("grad__model.layers.2.mlp.output", None, (2, "mlp", "grad.output")),
    ("grad__mlp_output", None, (-1, "mlp_output", "grad.value")),
    ("param__layer_start__weight", 2, (2, "layer_start", "param.weight")),
    ("lm_head.output", None, (-1, "lm_head", "output")),
    ("non_intrusive__inputs.0", None, (-1, "root", "inputs.0")),
    ("layer_start__hidden_states", 7, (7, "layer_start", "hidden_states")),
    ("logits", None, (-1, "logits", "value")),
    ("attn.q", 1, (1, "attn", "q")),
], ids=lambda v: str(v))
def test_split_dump_name(dumped, layer_id, expected):
    assert split_dump_name(dumped, layer_id) == expected


def test_values_with_dots_underscores_and_equals_parse():
    f = parse_dump_name("step=2___rank=0___dump_index=9___name=a.b_=c__d____layer_id=3.pt")
    assert f == {"step": "2", "rank": "0", "dump_index": "9", "name": "a.b_=c__d_", "layer_id": "3"}


@pytest.mark.parametrize("bad", [
    "step=1.pt", "noequals.pt", "=y___name=x.pt", "step=x___name=a.pt", "name=a___name=b.pt",
    "name=a.npy", "name=.pt", "1bad=2___name=a.pt",
])
def test_bad_names_raise_file_name_error(bad):
    with pytest.raises(FileNameError) as e:
        parse_dump_name(bad)
    assert e.value.file == bad and e.value.fix


def test_mapper_callback_overrides_the_rule(current_dump, tmp_path):
    src, _ = current_dump
    cap = import_capture("sglang", src, tmp_path / "cap",
                         mapper=lambda dumped, f: (int(f["layer_id"]), "x", f"{dumped}@{f['dump_index']}"))
    assert set(cap.index["op"]) == {"x"} and len(cap) == 16


def test_duplicate_keys_error_then_suffix(tmp_path):
    src = tmp_path / "d"
    for di in (1, 2, 3):
        _dump(src, dict(step=0, rank=0, dump_index=di, name="hidden", layer_id=0), torch.full((1,), float(di)))
    with pytest.raises(DuplicateKeyError) as e:
        import_capture("sglang", src, tmp_path / "cap")
    assert "duplicates='suffix'" in e.value.fix
    assert not (tmp_path / "cap" / "manifest.json").exists()
    cap = import_capture("sglang", src, tmp_path / "cap2", duplicates="suffix")
    assert list(cap.index["name"]) == ["value", "value#1", "value#2"]
    assert [float(cap.get(name=n)) for n in cap.index["name"]] == [1.0, 2.0, 3.0]


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > /tmp/workbench_pwned",))


@pytest.mark.parametrize("payload", ["object", "object_zip", "dict_non_tensor", "dict_extra_key", "list"])
def test_malicious_or_foreign_pt_refused(tmp_path, payload):
    src = tmp_path / "d"
    src.mkdir()
    p = src / format_dump_name(dict(step=0, rank=0, dump_index=1, name="x"))
    obj = {"object": {"value": Evil(), "meta": {}}, "object_zip": Evil(), "dict_non_tensor": {"value": {"a": torch.ones(1)}, "meta": {}},
           "dict_extra_key": {"value": torch.ones(1), "code": "x"}, "list": [torch.ones(1)]}[payload]
    with open(p, "wb") as f:
        if payload == "object":
            pickle.dump(obj, f, protocol=2)
        else:
            torch.save(obj, f)
    with pytest.raises(UnsafeFileError) as e:
        import_capture("sglang", src, tmp_path / "cap")
    assert e.value.file == str(p) and e.value.fix
    assert not Path("/tmp/workbench_pwned").exists()


def test_plain_values_are_kept_not_refused(tmp_path):
    """A dumped value that is plain data (SGLang's rids: a list of strings) is run metadata."""
    src = tmp_path / "d"
    _dump(src, dict(step=0, rank=0, dump_index=1, name="good"), torch.ones(2))
    torch.save({"value": ["req-1", 7, None], "meta": {}}, src / format_dump_name(dict(step=0, rank=0, dump_index=2,
                                                                                      name="rids")))
    cap = import_capture("sglang", src, tmp_path / "cap")
    assert len(cap) == 1 and cap.run["importer"]["values"] == 1
    assert cap.run["values"] == [{"step": 0, "rank": 0, "layer": -1, "name": "rids", "value": ["req-1", 7, None]}]


def test_on_error_skip_reports_what_was_skipped(tmp_path):
    src = tmp_path / "d"
    _dump(src, dict(step=0, rank=0, dump_index=1, name="good"), torch.ones(2))
    (src / "garbage_name.pt").write_bytes(b"x")
    (src / format_dump_name(dict(step=0, rank=0, dump_index=2, name="trunc"))).write_bytes(b"PK\x03\x04")
    (src / "notes.txt").write_text("ignored")
    with pytest.raises(FileNameError):
        import_capture("sglang", src, tmp_path / "cap")
    cap = import_capture("sglang", src, tmp_path / "cap2", on_error="skip")
    assert list(cap.index["op"]) == ["good"]
    skipped = cap.run["importer"]["skipped"]
    assert skipped["count"] == 2
    assert {s["error"] for s in skipped["files"]} == {"FileNameError", "ImporterError"}
    with pytest.raises(ImporterError, match="on_error"):
        import_capture("sglang", src, tmp_path / "cap3", on_error="ignore")


def test_empty_or_missing_source(tmp_path):
    with pytest.raises(ImporterError, match="does not exist"):
        import_capture("sglang", tmp_path / "nope", tmp_path / "cap")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ImporterError, match="no .pt files"):
        import_capture("sglang", tmp_path / "empty", tmp_path / "cap")


# -- fuzz ----------------------------------------------------------------------------------------
_key = st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(lambda k: "___" not in k)
_value = st.text(alphabet=string.ascii_letters + string.digits + "._-=+,:[]() ", min_size=0, max_size=20)
_underscored = st.text(alphabet="ab_=.", min_size=0, max_size=12)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_key, _value | _underscored, min_size=0, max_size=5), st.text(
    alphabet=string.ascii_letters + "._=", min_size=1, max_size=20).filter(lambda n: n.strip()))
def test_fuzz_roundtrip_of_generated_names(extra, name):
    fields = {"name": name, **{k: v for k, v in extra.items() if k not in
                                ("name", "step", "rank", "dump_index", "layer_id", "forward_pass_id")}}
    # the one documented ambiguity: a value holding "___key=" reads as two fields
    assume(not any(_SPLIT.search(v) for v in fields.values()))
    assert parse_dump_name(format_dump_name(fields)) == {k: str(v) for k, v in fields.items()}


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=60))
def test_fuzz_arbitrary_names_only_raise_file_name_error(s):
    try:
        f = parse_dump_name(s)
    except FileNameError:
        return
    assert f["name"] and s.endswith(".pt")
    split_dump_name(f["name"], None)  # never raises


def test_non_finite_meta_values_are_kept_as_strings(tmp_path):
    src = tmp_path / "dump"
    src.mkdir()
    fields = dict(step=0, rank=0, dump_index=1, name="x", layer_id=0)
    torch.save({"value": torch.ones(2), "meta": {**fields, "scale": float("nan"), "top": float("inf")}},
               src / format_dump_name(fields))
    cap = import_capture("sglang", src, tmp_path / "cap")
    tags = cap.index["tags"].iloc[0]
    assert tags["scale"] == "nan" and tags["top"] == "inf" and cap.verify().ok


@pytest.mark.parametrize("where", ["same", "inside", "contains"])
def test_destination_overlapping_the_source_is_refused(current_dump, tmp_path, where):
    src, _ = current_dump
    dst = {"same": src, "inside": src / "cap", "contains": src.parent}[where]
    before = sorted(p.name for p in src.iterdir())
    with pytest.raises(ImporterError, match="destination .* the dump being imported"):
        import_capture("sglang", src, dst, overwrite=True)
    assert sorted(p.name for p in src.iterdir()) == before


GRAD_FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sglang_grad"


def test_gradient_dumps_without_layer_id_take_their_tensors_layers(tmp_path):
    """SGLang's own dumper with DUMPER_ENABLE_GRAD=1 and the layer set by dumper.set_ctx, as its
    models do (scripts/make_sglang_grad_fixtures.py): the gradient files carry no layer_id. Each
    takes the layer of its tensor's forward dump in backward order, which the values confirm:
    h[L+1] = h[L] + mlp_output[L], so the gradient of layer L's MLP output is exactly that of layer
    L+1's input."""
    from workbench.analysis import compare_captures
    from workbench.capture import open_capture

    caps = {}
    for arm in ("control", "candidate"):
        import_capture("sglang", GRAD_FIXTURES / arm, tmp_path / arm)
        caps[arm] = open_capture(tmp_path / arm)
    cap = caps["control"]
    idx = cap.index
    grads = idx[idx["name"] == "grad.value"]
    assert sorted(grads[grads["op"] == "mlp_output"]["layer"]) == [0, 1, 2]
    assert sorted(grads[grads["op"] == "layer_input"]["layer"]) == [1, 2]  # layer 0's input (embeddings) needs no grad
    assert all(t.get("layer_from") == "backward order of mlp_output's forward dumps"
               for t in grads[grads["op"] == "mlp_output"]["tags"])
    for layer in (0, 1):
        assert torch.equal(cap.get(layer=layer, op="mlp_output", name="grad.value"),
                           cap.get(layer=layer + 1, op="layer_input", name="grad.value"))
    assert not torch.equal(cap.get(layer=1, op="mlp_output", name="grad.value"),
                           cap.get(layer=1, op="layer_input", name="grad.value"))
    res = compare_captures(caps["control"], caps["candidate"])
    first = res.first_divergence()
    assert (first["layer"], first["op"], first["name"]) == (1, "mlp_output", "value")
