"""The EOS flip found from two runs' captured logits (tests/notebooks/user_eos.py): the step, the
tokens by name from the run's tokenizer.json, both arms' probabilities and the draws that flip."""

from __future__ import annotations

import pytest

from workbench.analysis import sampling_flips_captures
from workbench.analysis.sampling import read_vocab

from .helpers import run_one
from .user_eos import FLIP_STEP, write_eos_runs

pytestmark = pytest.mark.slow  # the end-to-end tier: make test-all (CI), not make test


@pytest.fixture(scope="module")
def eos_runs(tmp_path_factory):
    d = tmp_path_factory.mktemp("eos")
    return d, write_eos_runs(d)


def test_read_vocab_decodes_byte_level_tokens(eos_runs):
    d, ids = eos_runs
    vocab = read_vocab(d / "tokenizer.json")
    assert vocab[ids["newline"]] == "\n" and vocab[ids["eos"]] == "<|endoftext|>"
    assert read_vocab(d) == vocab  # the folder holding it


def test_the_eos_flip_is_found_in_the_captured_logits(eos_runs):
    d, ids = eos_runs
    ds = sampling_flips_captures(d / "control", d / "candidate", vocab=str(d / "tokenizer.json"))
    assert ds.attrs["step"] == FLIP_STEP and ds.attrs["first_differing_step"] == FLIP_STEP
    assert ds.attrs["total_width"] == pytest.approx(0.079083, abs=2e-6)
    big = ds.isel(interval=int(ds.width.values.argmax()))
    # index order: newline (a byte token) comes before EOS (an added token), so the draws in
    # [P(newline | candidate), P(newline | control)) go from newline to EOS
    assert (int(big.token_control), int(big.token_candidate)) == (ids["newline"], ids["eos"])
    assert float(big.lo) == pytest.approx(0.160266, abs=2e-6) and float(big.hi) == pytest.approx(0.239349, abs=2e-6)
    p = ds.sel(flip_token=[ids["eos"], ids["newline"]])
    assert p.p_control.values == pytest.approx([0.760651, 0.239349], abs=1e-6)
    assert p.p_candidate.values == pytest.approx([0.839734, 0.160266], abs=1e-6)
    s = ds.attrs["sentence"]
    eos, nl = f"'<|endoftext|>' ({ids['eos']})", f"'\\n' ({ids['newline']})"
    assert f"draws {nl} under control and {eos} under candidate" in s, s
    assert f"{eos} 0.760651 -> 0.839734, {nl} 0.239349 -> 0.160266" in s, s


def test_sampling_flips_notebook_names_the_flip(eos_runs, tmp_path, monkeypatch):
    d, ids = eos_runs
    monkeypatch.chdir(d)
    r = run_one(tmp_path / "out", "sampling_flips", control="control", candidate="candidate",
                tokenizer="tokenizer.json")
    assert r.status == "passed", r.describe()
    text = r.findings[0]["text"]
    assert text.startswith(f"step {FLIP_STEP}: a shared draw u samples different tokens with probability 0.079083"), text
    assert "0.760651 -> 0.839734" in text and "'<|endoftext|>'" in text
