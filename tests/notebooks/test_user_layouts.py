"""first_divergence on SGLang dumps of other parallel layouts (tests/fixtures/sglang_tp: written by
SGLang 0.5.23's own dumper at TP=1 and TP=2), imported with `workbench import sglang`: every
tensor is named `value`, the A/A repeat is the TP1 run."""

from pathlib import Path

from workbench.capture.importers import import_capture
from workbench.runner import run_notebooks

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
