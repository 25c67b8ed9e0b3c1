"""Folder importer: pattern compilation and matching, file types, order, refusals."""

from __future__ import annotations

import os
import pickle
import re
import string
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

from workbench.capture.importers import import_capture
from workbench.capture.importers.folder import compile_pattern, match_path
from workbench.errors import (
    DuplicateKeyError, FileNameError, ImporterError, UnsafeFileError, UnsafePathError,
)

PATTERN = "rank{rank}/step{step}/{op}.{layer}.{name}.*"


@pytest.fixture
def mixed(tmp_path):
    """ranks 0-1, steps 0-2 (step10 sorts after step2), one file of each type per folder."""
    src = tmp_path / "dump"
    for r in range(2):
        for s in (0, 2, 10):
            d = src / f"rank{r}" / f"step{s}"
            d.mkdir(parents=True)
            torch.save(torch.full((2,), float(s), dtype=torch.bfloat16), d / "self_attn.o_proj.3.output.pt")
            np.save(d / "mlp.1.input.npy", np.arange(3, dtype=np.float32) + r)
            np.savez(d / "gdn.2.state.npz", k=np.zeros((2, 2)), v=np.ones(2, dtype=np.int32))
            save_file({"q": torch.ones(1, dtype=torch.float16)}, str(d / "qsa.-1.q.safetensors"))
            (d / "README.txt").write_text("not a tensor")
    return src


def test_import_mixed_types(mixed, tmp_path):
    cap = import_capture("folder", mixed, tmp_path / "cap", pattern=PATTERN, arm="control")
    assert len(cap) == 2 * 3 * 5
    assert cap.get(rank=1, step=10, layer=3, op="self_attn.o_proj", name="output").dtype == torch.bfloat16
    assert torch.equal(cap.get(rank=1, step=0, op="mlp"), torch.arange(3, dtype=torch.float32) + 1)
    assert set(cap.select(op="gdn").index["name"]) == {"state.k", "state.v"}
    assert cap.get(rank=0, step=2, op="gdn", name="state.v").dtype == torch.int32
    assert cap.get(rank=0, step=2, op="qsa").dtype == torch.float16  # single array keeps the pattern's name
    assert cap.select(op="qsa").index["layer"].unique().tolist() == [-1]
    # causal order: step first (numerically: 2 before 10), then path
    steps = cap.index["step"].tolist()
    assert steps == sorted(steps)
    assert cap.index["rank"].tolist()[:5] == [0] * 5
    assert cap.run["importer"]["pattern"] == PATTERN


def test_extra_fields_become_tags_and_missing_fields_default(tmp_path):
    src = tmp_path / "d"
    (src / "tp3").mkdir(parents=True)
    torch.save({"a": torch.ones(1), "b": {"c": torch.zeros(1)}}, src / "tp3" / "x.pt")
    cap = import_capture("folder", src, tmp_path / "cap", pattern="tp{tp}/{op}.pt")
    assert list(cap.index["name"]) == ["a", "b.c"]
    assert cap.index["tags"].iloc[0] == {"tp": "3", "array": "a"}
    assert cap.index[["rank", "step", "layer"]].drop_duplicates().values.tolist() == [[0, 0, -1]]


def test_wildcards_repeated_fields_and_literal_braces():
    rx, fields = compile_pattern("**/{op}/{op}_{*}.{{x}}.pt")
    assert fields == ("op",)
    assert match_path(rx, fields, "a/b/mlp/mlp_anything.{x}.pt") == {"op": "mlp"}
    with pytest.raises(FileNameError):
        match_path(rx, fields, "mlp/attn_z.{x}.pt")


def test_shortest_text_field_lets_ints_match():
    rx, f = compile_pattern("{op}.{layer}.{name}.pt")
    assert match_path(rx, f, "self_attn.o_proj.-1.out.x.pt") == {"op": "self_attn.o_proj", "layer": -1,
                                                                  "name": "out.x"}
    with pytest.raises(FileNameError):
        match_path(rx, f, "mlp.three.out.pt")


@pytest.mark.parametrize("pattern", ["/abs/{op}.pt", "../{op}.pt", "a/../../{op}.pt", "C:/x/{op}.pt"])
def test_path_traversal_in_patterns_refused(pattern):
    with pytest.raises(UnsafePathError) as e:
        compile_pattern(pattern)
    assert e.value.fix


@pytest.mark.parametrize("pattern", ["", "{op", "op}", "{1x}.pt", "{a b}.pt", "a\\b.pt"])
def test_malformed_patterns(pattern):
    with pytest.raises(ImporterError, match="pattern"):
        compile_pattern(pattern)


def test_regex_metacharacters_are_literal(tmp_path):
    rx, f = compile_pattern("(a)+[b]$^.{name}.pt")
    assert match_path(rx, f, "(a)+[b]$^.q.pt") == {"name": "q"}
    with pytest.raises(FileNameError):
        match_path(rx, f, "aa[b]$^.q.pt")


def test_link_leaving_the_dump_refused(tmp_path):
    outside = tmp_path / "secret.npy"
    np.save(outside, np.ones(1, dtype=np.float32))
    src = tmp_path / "d"
    src.mkdir()
    os.symlink(outside, src / "x.npy")
    with pytest.raises(UnsafePathError):
        import_capture("folder", src, tmp_path / "cap", pattern="{name}.npy")


@pytest.mark.parametrize("kind", ["npy_object", "npz_object", "pt_object", "pt_dict_str"])
def test_object_payloads_refused(tmp_path, kind):
    src = tmp_path / "d"
    src.mkdir()
    if kind == "npy_object":
        np.save(src / "x.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    elif kind == "npz_object":
        np.savez(src / "x.npz", a=np.array([None, 1], dtype=object))
    elif kind == "pt_object":
        with open(src / "x.pt", "wb") as fh:
            pickle.dump({"t": torch.ones(1), "cb": os.getcwd}, fh, protocol=2)
    else:
        torch.save({"t": torch.ones(1), "s": "text"}, src / "x.pt")
    with pytest.raises(UnsafeFileError) as e:
        import_capture("folder", src, tmp_path / "cap", pattern="{name}.*")
    assert e.value.file.endswith(("x.npy", "x.npz", "x.pt"))
    assert not (tmp_path / "cap" / "manifest.json").exists()


def test_non_matching_paths_raise_or_skip(tmp_path, mixed):
    torch.save(torch.ones(1), mixed / "rank0" / "stray.pt")
    with pytest.raises(FileNameError) as e:
        import_capture("folder", mixed, tmp_path / "cap", pattern=PATTERN)
    assert "stray.pt" in e.value.message
    cap = import_capture("folder", mixed, tmp_path / "cap2", pattern=PATTERN, on_error="skip")
    assert len(cap) == 30
    assert cap.run["importer"]["skipped"]["files"][0]["file"] == "rank0/stray.pt"


def test_duplicate_keys_name_the_file_and_fix(tmp_path):
    src = tmp_path / "d"
    for sub in ("a", "b"):
        (src / sub).mkdir(parents=True)
        np.save(src / sub / "x.npy", np.ones(1, dtype=np.float32))
    with pytest.raises(DuplicateKeyError) as e:
        import_capture("folder", src, tmp_path / "cap", pattern="*/{name}.npy")
    assert "b/x.npy" in e.value.message and "pattern" in e.value.fix


def test_unknown_option_lists_valid_ones(tmp_path, mixed):
    with pytest.raises(ImporterError, match="valid options"):
        import_capture("folder", mixed, tmp_path / "cap", pattern=PATTERN, patern="x")


# -- fuzz ----------------------------------------------------------------------------------------
_lit = st.text(alphabet=string.ascii_letters + string.digits + "._-+()[]$^ ", min_size=1, max_size=6)
_text = st.text(alphabet=string.ascii_letters + "_", min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["rank", "step", "layer", "op", "name", "tp"]), min_size=1, max_size=4,
                unique=True), st.lists(_lit, min_size=5, max_size=5), st.data())
def test_fuzz_generated_paths_roundtrip(fields, lits, data):
    # fields separated by literals that start with a character no value can hold, so parsing is unique
    seps = ["/" + lit if i % 2 else "~" + lit for i, lit in enumerate(lits)]
    pattern = "".join(f"{{{f}}}{seps[i]}" for i, f in enumerate(fields)) + "end.pt"
    values = {f: data.draw(st.integers(0 if f != "layer" else -1, 999)) if f in ("rank", "step", "layer")
              else data.draw(_text) for f in fields}
    rel = "".join(f"{values[f]}{seps[i]}" for i, f in enumerate(fields)) + "end.pt"
    rx, got_fields = compile_pattern(pattern)
    assert got_fields == tuple(fields)
    assert match_path(rx, got_fields, rel) == values


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=string.printable, max_size=30), st.text(max_size=30))
def test_fuzz_arbitrary_patterns_and_paths_only_raise_typed_errors(pattern, path):
    try:
        rx, fields = compile_pattern(pattern)
    except (ImporterError, UnsafePathError):
        return
    assert isinstance(rx, re.Pattern)
    try:
        match_path(rx, fields, path)
    except FileNameError:
        pass


def test_import_with_overwrite_never_deletes_its_own_source(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    torch.save(torch.ones(2), d / "a.0.x.pt")
    for dst in (d, d / "sub"):
        with pytest.raises(ImporterError, match="the dump being imported"):
            import_capture("folder", d, dst, pattern="{op}.{layer}.{name}.pt", overwrite=True)
    assert sorted(p.name for p in d.iterdir()) == ["a.0.x.pt"]


def test_files_of_one_step_are_ordered_numerically(tmp_path):
    # causal order inside a step follows the path with its numbers read as numbers: layer 2, 9, 10
    src = tmp_path / "d"
    src.mkdir()
    for layer in (10, 2, 9):
        torch.save(torch.full((1,), float(layer)), src / f"mlp.{layer}.output.pt")
    cap = import_capture("folder", src, tmp_path / "cap", pattern="{op}.{layer}.{name}.pt")
    assert cap.index.sort_values("seq")["layer"].tolist() == [2, 9, 10]
