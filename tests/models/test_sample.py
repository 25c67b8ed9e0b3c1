from pathlib import Path

import pytest

from workbench.analysis.compare import compare_captures
from workbench.capture import open_capture
from workbench.models.sample import ARMS, PLANTED, write_samples
from workbench.numerics.metrics import compare

BUNDLED = Path(__file__).resolve().parents[2] / "captures"


def _key(row):
    return {f: row[f] for f in PLANTED}


def test_bundled_captures_show_the_planted_divergence():
    r = compare_captures(BUNDLED / "control", BUNDLED / "candidate", aa=BUNDLED / "control-repeat")
    fd = r.first_divergence()
    assert _key(fd) == PLANTED
    # the A/A repeat really carries noise (not a copy) and stays under its own thresholds
    aa = compare_captures(BUNDLED / "control", BUNDLED / "control-repeat")
    assert (aa.table["n_diff"] > 0).any() and aa.first_divergence() is None
    assert open_capture(BUNDLED / "candidate").run["expect"]["first_divergence"] == PLANTED


def test_bundled_captures_are_intact():
    for arm in ARMS:
        assert open_capture(BUNDLED / arm).verify().ok


def test_regeneration_matches_the_bundled_captures(tmp_path):
    paths = write_samples(tmp_path)
    for p in paths:
        new, old = open_capture(p), open_capture(BUNDLED / p.name)
        cols = ["rank", "step", "layer", "op", "name", "seq", "dtype", "shape"]
        assert new.index[cols].equals(old.index[cols]), p.name
        bitwise = 0
        for (key, a), (_, b) in zip(old, new):
            c = compare(a, b)
            # bitwise on the machine that made them; a different CPU may reassociate fp32 sums
            assert c.rel_l2 <= 1e-5 or c.max_abs <= 1e-5, (p.name, key, str(c))
            bitwise += c.bitwise_equal
        assert bitwise >= 0.5 * len(old)
        assert new.run["tokens"] == old.run["tokens"], p.name
