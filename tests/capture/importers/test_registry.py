"""Importer registry: built-ins, registration, entry-point plugins that fail to load, typed errors."""

from __future__ import annotations

import warnings
from importlib import metadata
from pathlib import Path

import pytest
import torch

import workbench
from workbench.capture import importers as imp
from workbench import plugins
from workbench.capture.importers import base
from workbench.capture.writer import CaptureWriter
from workbench.errors import ImporterError


class OneTensor(imp.Importer):
    name = "one"
    description = "writes one tensor"

    def run(self, src, dst, *, arm=None, run=None, value: float = 1.0):
        with CaptureWriter(dst, arm=arm or "imported", run=run) as w:
            w.add(torch.full((2,), value), op="x", name="y")
        return Path(dst)


class Unavailable(imp.Importer):
    name = "nope"
    description = "needs a GPU library"

    @classmethod
    def is_available(cls):
        return False, "libfoo is not installed"


@pytest.fixture
def registry():
    state = base.REGISTRY.snapshot()
    base.REGISTRY.restore(state, reload_entry_points=True)
    yield base.REGISTRY
    base.REGISTRY.restore(state)


def test_builtins_listed_and_available(registry):
    infos = {i.name: i for i in imp.importers()}
    assert {"sglang", "folder", "flashinfer"} <= set(infos)
    assert infos["sglang"].available and infos["sglang"].description
    assert infos["folder"].source == "builtin"


def test_register_and_import_capture_with_options(registry, tmp_path):
    imp.register_importer("one", OneTensor)
    src = tmp_path / "dump"  # outside the destinations: a destination inside its source is refused
    src.mkdir()
    cap = imp.import_capture("one", src, tmp_path / "cap", arm="a", value=3.0)
    assert torch.equal(cap.get(op="x"), torch.full((2,), 3.0))
    assert workbench.import_capture is imp.import_capture
    with pytest.raises(ImporterError, match=r"valid options are \['arm', 'run', 'value'\]"):
        imp.import_capture("one", src, tmp_path / "cap2", valeu=3.0)
    cap = imp.import_capture("one", src, tmp_path / "cap3", arm="a", value="2.5")  # text from the CLI
    assert float(cap.get(op="x")[0]) == 2.5
    with pytest.raises(ImporterError, match="already registered"):
        imp.register_importer("one", Unavailable)
    with pytest.raises(ImporterError, match="Importer subclass"):
        imp.register_importer("bad", object)


def test_unknown_kind_lists_valid_kinds(registry, tmp_path):
    with pytest.raises(ImporterError) as e:
        imp.import_capture("vllm", tmp_path, tmp_path / "cap")
    assert "folder" in e.value.message and "sglang" in e.value.message and e.value.key == "vllm"


def test_unavailable_importer_says_why(registry, tmp_path):
    imp.register_importer("nope", Unavailable)
    info = {i.name: i for i in imp.importers()}["nope"]
    assert not info.available and "libfoo" in info.reason
    with pytest.raises(ImporterError, match="libfoo"):
        imp.import_capture("nope", tmp_path, tmp_path / "cap")


def test_entry_point_plugins_load_and_broken_ones_warn(registry, monkeypatch, tmp_path):
    eps = [
        metadata.EntryPoint("good", f"{__name__}:OneTensor", base.ENTRY_POINT_GROUP),
        metadata.EntryPoint("broken", "workbench_missing_plugin.mod:Thing", base.ENTRY_POINT_GROUP),
        metadata.EntryPoint("notaclass", "os:getcwd", base.ENTRY_POINT_GROUP),
        metadata.EntryPoint("sglang", "elsewhere:Other", base.ENTRY_POINT_GROUP),
    ]
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: [e for e in eps if e.group == group])
    with pytest.warns(imp.ImporterWarning) as rec:
        infos = {i.name: i for i in imp.importers()}
    msgs = " ".join(str(w.message) for w in rec)
    assert "broken" in msgs and "ModuleNotFoundError" in msgs and "notaclass" in msgs
    assert "'sglang'" in msgs and "ignored" in msgs  # a plugin cannot silently replace a built-in
    assert infos["good"].available and infos["good"].source.startswith("entry point")
    assert not infos["broken"].available and "workbench_missing_plugin" in infos["broken"].reason
    assert infos["sglang"].source == "builtin"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cap = imp.import_capture("good", tmp_path / "src", tmp_path / "cap")  # loading one plugin ignores others
    assert len(cap) == 1
    with pytest.raises(ImporterError, match="failed to load"):
        imp.import_capture("broken", tmp_path, tmp_path / "cap2")


def test_installed_entry_points_name_the_builtins():
    eps = {e.name: e.value for e in metadata.entry_points(group=base.ENTRY_POINT_GROUP)}
    for name, target in eps.items():
        if name in base._BUILTIN:
            assert target == base._BUILTIN[name]


def test_text_options_from_the_command_line_are_converted(tmp_path):
    src = tmp_path / "d"
    src.mkdir()
    torch.save({"value": torch.ones(1), "meta": {}}, src / "forward_pass_id=0___name=x.pt")
    cap = imp.import_capture("sglang", src, tmp_path / "cap", rank="3", overwrite="false")
    assert cap.index["rank"].tolist() == [3]
    with pytest.raises(ImporterError, match="integer"):
        imp.import_capture("sglang", src, tmp_path / "cap2", rank="three")
    with pytest.raises(ImporterError, match="true or false"):
        imp.import_capture("sglang", src, tmp_path / "cap2", overwrite="maybe")
