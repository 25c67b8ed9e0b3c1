"""A request served alone and inside a batch, dumped by SGLang 0.5.23's own dumper in its default
core mode (tests/fixtures/sglang_batch, scripts/make_sglang_batch_fixtures.py): the dump holds
`rids`, a list of request-id strings; the import keeps it as run metadata, never stops on it, and
turns rids + positions + seq_lens into batch rows, so the two runs compare position by position."""

from pathlib import Path

import pytest

from workbench.analysis import compare_captures
from workbench.analysis.tokens import token_agreement
from workbench.capture.importers import import_capture
from workbench.capture.importers.sglang import batch_rows_from_core

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "sglang_batch"


@pytest.fixture(scope="module")
def caps(tmp_path_factory):
    d = tmp_path_factory.mktemp("batch")
    return {n: import_capture("sglang", FIX / n, d / n) for n in ("alone", "batch")}


def test_rids_are_metadata_and_batch_rows(caps):
    cap = caps["batch"]
    imp = cap.run["importer"]
    assert imp["skipped"]["count"] == 0 and imp["values"] == 6 and imp["batch_rows"] == [0, 1, 2]
    rids = [v["value"] for v in cap.run["values"] if v["name"] == "rids"]
    assert rids == [["req-B", "req-A"]] * 3 and cap.run["requests"] == ["req-B", "req-A"]
    # allocator slots are bookkeeping: in the run values, not compared as tensors
    assert not (cap.index["op"] == "req_pool_indices").any()
    from workbench.capture.align import batch_rows

    assert batch_rows(cap, 0) == [("req-B", 0), ("req-B", 1), ("req-B", 2)] + [("req-A", p) for p in range(5)]
    assert batch_rows(cap, 2) == [("req-B", 4), ("req-A", 6)]


def test_alone_against_batch_by_request_and_position(caps):
    res = compare_captures(caps["alone"], caps["batch"])
    assert res.align == "tokens" and res.first_divergence() is None
    assert set(res.table["status"]) == {"ok"} and float(res.table["rel_l2"].max()) == 0.0
    steps = compare_captures(caps["alone"], caps["batch"], align="steps")
    assert steps.first_divergence() is not None  # step by step, A's rows are not where they were


def test_core_rows_rule():
    assert batch_rows_from_core(["a", "b"], [0, 1, 2, 5], [3, 6]) == [("a", 0), ("a", 1), ("a", 2), ("b", 5)]
    assert batch_rows_from_core(["a"], [4], [5]) == [("a", 4)]
    assert batch_rows_from_core(["a", "b"], [0, 1, 2], [3, 6]) is None      # b's rows missing
    assert batch_rows_from_core(["a"], [0, 2], [3]) is None                  # not consecutive
    assert batch_rows_from_core(["a", "b"], [0], [1]) is None                # ids and lengths disagree
