from pathlib import Path


from workbench.widgets import CaptureExplorer, ReplayPanel

CAPTURES = Path(__file__).resolve().parents[2] / "captures"


def _ys(live):
    return [tuple(d.y) for d in live.figure.data]


def test_explorer_updates_in_place():
    ex = CaptureExplorer(CAPTURES / "control", CAPTURES / "candidate", aa=CAPTURES / "control-repeat", step=[0, 1])
    before = _ys(ex.by_layer)
    ex.controls["op"].value = "gdn"
    assert _ys(ex.by_layer) != before
    before = _ys(ex.by_step)
    ex.controls["metric"].value = "max_abs"
    assert _ys(ex.by_step) != before


def test_replay_panel_runs():
    p = ReplayPanel(CAPTURES / "control", op="gdn", layer=0, rank=0, max_cases=2)
    p.run()
    n = len(p.figure.figure.data)
    p.knobs["state_dtype"].value = "bf16"
    p.run()
    assert len(p.figure.figure.data) == n + 1
