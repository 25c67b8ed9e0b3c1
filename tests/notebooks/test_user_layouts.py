"""first_divergence on SGLang dumps of other parallel layouts (tests/fixtures/sglang_tp: written by
SGLang 0.5.23's own dumper at TP=1 and TP=2), imported with `workbench import sglang`: every
tensor is named `value`, the A/A repeat is the TP1 run."""

import pytest
from pathlib import Path

from workbench.capture.importers import import_capture
from workbench.runner import run_notebooks

pytestmark = pytest.mark.slow  # the end-to-end tier: make test-all (CI), not make test

ROOT = Path(__file__).resolve().parents[2]


def test_first_divergence_across_layouts_names_the_rank(tmp_path, monkeypatch):
    for name in ("tp1", "tp2", "tp2-bf16"):
        import_capture("sglang", ROOT / "tests" / "fixtures" / "sglang_tp" / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    res = run_notebooks([ROOT / "notebooks" / "first_divergence.ipynb"], out=tmp_path / "r", html_reports=False,
                        parameters={"control": "tp2", "candidate": "tp2-bf16", "aa": "tp1"}, log=lambda *a: None)
    (r,) = res.notebooks
    assert r.status == "passed", r.describe()
    texts = [f["text"] for f in r.findings]
    assert texts[0].startswith("first divergence: rank 0, step 0, layer 1, mlp_partial/value"), texts
    by_rank = next(f for f in r.findings if f["text"].startswith("the first divergence by rank"))
    assert by_rank["data"]["rank"] == 1
    raw = run_notebooks([ROOT / "notebooks" / "first_divergence.ipynb"], out=tmp_path / "raw", html_reports=False,
                        parameters={"control": "tp2", "candidate": "tp2-bf16", "aa": "", "grouping": "raw"},
                        log=lambda *a: None).notebooks[0]
    assert raw.findings[0]["text"].startswith("first divergence: rank 1, step 0, layer 1, mlp_partial/value")


def test_layouts_notebook_on_sglang_dumps(tmp_path, monkeypatch):
    """layouts.ipynb on SGLang's own TP dumps: the logical comparison finds layer 1's partial; the
    dumps hold no weights, so the replay is the all-reduce's, which names rank 1's bf16 partial;
    TP1 against TP2 of the same math passes every regression gate."""
    from .helpers import gates_by_name, run_one

    for name in ("tp1", "tp2", "tp2-bf16"):
        import_capture("sglang", ROOT / "tests" / "fixtures" / "sglang_tp" / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    names = "partial:mlp_partial/value output:mlp_output/value act:mlp_up/value"
    r = run_one(tmp_path / "bad", "layouts", control="tp1", candidate="tp2-bf16", chunked="", names=names,
                require_no_divergence=False)
    assert r.status == "passed", r.describe()
    pair, shard = r.findings
    assert pair["data"]["diverged"] and pair["data"]["layer"] == 1 and "mlp_partial/value" in pair["text"]
    assert shard["data"]["bf16_partials"] == ["layer 1: rank 1 holds a partial of bf16 values only"], shard["text"]
    assert "sequential in fp32 reproduces the output bitwise" in shard["text"]
    ok = run_one(tmp_path / "ok", "layouts", control="tp1", candidate="tp2", chunked="", names=names)
    assert ok.status == "passed", ok.describe()
    assert {"no_logical_divergence", "replicas_agree", "tokens_same"} <= set(gates_by_name(ok))
    assert not ok.findings[1]["data"]["bf16_partials"]
    # the same faulty pair with the regression gate on fails on it, by name
    gated = run_one(tmp_path / "gated", "layouts", control="tp1", candidate="tp2-bf16", chunked="", names=names)
    assert gated.status == "failed" and gated.error["gates"] == ["no_logical_divergence"]
