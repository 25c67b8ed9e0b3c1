"""Logical comparison on dumps written by SGLang 0.5.23's own dumper (tests/fixtures/sglang_tp,
made by scripts/make_sglang_tp_fixtures.py): a tiny decoder at TP=1, at TP=2 with the same math,
and at TP=2 with rank 1's layer-1 MLP partial sum rounded to bf16."""

from pathlib import Path

import pytest
import torch

from workbench.analysis import compare_captures
from workbench.capture import CaptureWriter, open_capture
from workbench.capture.importers import import_capture
from workbench.capture.logical import LogicalCapture
from workbench.cli import main
from workbench.errors import DimsError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang_tp"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("sglang_tp")
    for name in ("tp1", "tp2", "tp2-bf16"):
        import_capture("sglang", FIXTURES / name, d / name)
    return {name: d / name for name in ("tp1", "tp2", "tp2-bf16")}


def test_import_keeps_dims_and_parallel_info(runs):
    cap = open_capture(runs["tp2"])
    row = cap.select(op="mlp_partial", layer=0, step=0, rank=1).index.iloc[0]
    assert row["tags"]["dims"] == "t h[tp:partial]" and row["tags"]["tp_rank"] == 1 and row["tags"]["tp_size"] == 2
    assert cap.run["parallel"]["sglang_parallel_info"]["tp_size"] == 2


def test_tp1_against_tp2_of_the_same_math_does_not_diverge(runs):
    res = compare_captures(runs["tp1"], runs["tp2"])
    assert res.grouping == "logical" and res.first_divergence() is None and res.same_keys
    assert len(res.table) == 33 and float(res.table["rel_l2"].max()) < 1e-6
    layouts = dict(zip(res.table["op"], res.table["layout_candidate"]))
    assert layouts["mlp_up"] == "tp:concat(i)" and layouts["mlp_partial"] == "tp:sum"
    assert layouts["logits"] == "tp:concat(v)" and layouts["mlp_output"] == "tp:replicated"
    assert res.replicas.empty and not res.layout_notes
    raw = compare_captures(runs["tp1"], runs["tp2"], grouping="raw")  # what rank-by-rank makes of it
    assert raw.first_divergence() is not None and not raw.same_keys


@pytest.mark.parametrize("grouping", ["logical", "raw"])
def test_planted_bf16_partial_is_found_at_its_layer_and_rank(runs, grouping):
    res = compare_captures(runs["tp2"], runs["tp2-bf16"], grouping=grouping)
    fd = res.first_divergence()
    assert (fd["layer"], fd["op"]) == (1, "mlp_partial")
    rank = int(fd["rank"]) if grouping == "raw" else int(res.by_rank().set_index("rank")["rel_l2"].idxmax())
    assert rank == 1
    if grouping == "logical":
        assert res.by_rank().set_index("rank").loc[0, "rel_l2"] == 0.0


def test_tp1_against_the_planted_tp2_finds_the_layer(runs):
    res = compare_captures(runs["tp1"], runs["tp2-bf16"])
    fd = res.first_divergence()
    assert (fd["layer"], fd["op"], fd["status"]) == (1, "mlp_partial", "diverged")
    br = res.by_rank()
    assert br.empty and "partial sums over tp cannot be taken apart" in br.attrs["reason"]
    # a concatenated tensor is taken apart against the control's slices
    ok = res.by_rank(dict(step=0, layer=1, op="mlp_up", name="value"))
    assert list(ok["rank"]) == [0, 1] and float(ok["rel_l2"].max()) < 1e-6


def test_cli_grouping(runs, capsys):
    assert main(["compare", str(runs["tp1"]), str(runs["tp2"])]) == 0
    out = capsys.readouterr().out
    assert "grouping: logical" in out and "no divergence" in out
    assert main(["compare", str(runs["tp1"]), str(runs["tp2"]), "--grouping", "raw"]) == 1
    assert main(["compare", str(runs["tp1"]), str(runs["tp2-bf16"]), "--grouping", "logical"]) == 1
    assert "by rank: partial sums over tp cannot be taken apart" in capsys.readouterr().out
    import subprocess
    import sys

    bad = subprocess.run([sys.executable, "-m", "workbench.cli", "compare", str(runs["tp1"]), str(runs["tp2"]),
                          "--grouping", "sideways"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'sideways'" in bad.stderr


def test_replica_that_disagrees_is_its_own_finding(tmp_path):
    x = torch.ones(2, 4)
    with CaptureWriter(tmp_path / "a", arm="a") as w:
        w.add(x, op="norm", name="out", dims="t h # tp:replicated")
    with CaptureWriter(tmp_path / "b", arm="b") as w:
        for r in range(4):
            w.add(x + (r == 2), rank=r, op="norm", name="out", dims="t h # tp:replicated", tp_rank=r, tp_size=4)
    res = compare_captures(tmp_path / "a", tmp_path / "b")
    assert res.first_divergence() is None  # rank 0's copy is the logical tensor
    (line,) = res.describe_replicas()
    assert "b: step 0, layer -1, norm/out: rank 2 (tp 2) differs from its replicas by up to 1.000e+00" == line


def test_without_dims_equal_ranks_are_replicas_and_unequal_ones_stay_apart(tmp_path):
    with CaptureWriter(tmp_path / "c", arm="c") as w:
        for r in range(2):
            w.add(torch.ones(3), rank=r, op="same", name="x")
            w.add(torch.full((3,), float(r)), rank=r, op="heads", name="x")
    view = LogicalCapture(open_capture(tmp_path / "c"))
    assert dict(zip(view.index["op"] + view.index["rank"].astype(str), view.index["layout"])) == {
        "same0": "rank:replicated", "heads0": "raw", "heads1": "raw"}
    assert "no dims spec says how to join them" in view.notes[0]


def test_writer_and_importer_refuse_a_spec_that_does_not_fit(tmp_path):
    with CaptureWriter(tmp_path / "w", arm="w") as w:
        with pytest.raises(DimsError, match="names 3 dim"):
            w.add(torch.ones(2, 2), op="a", name="b", dims="t h d")
        with pytest.raises(DimsError, match="unknown axis"):
            w.add(torch.ones(2, 2), op="a", name="c", dims="t h[qq]")
    dump = tmp_path / "dump"
    dump.mkdir()
    torch.save({"value": torch.ones(2, 2), "meta": {"dims": "t h[tp"}},
               dump / "step=0___rank=0___dump_index=1___name=x.pt")
    with pytest.raises(DimsError, match="cannot read dims token"):
        import_capture("sglang", dump, tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing half-written
    cap = import_capture("sglang", dump, tmp_path / "y", on_error="skip")
    assert len(cap) == 0 and cap.run["importer"]["skipped"]["count"] == 1
