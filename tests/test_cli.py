import json
import subprocess
import sys

import torch

from workbench.capture import CaptureWriter
from workbench.cli import main


def _cap(p, scale=1.0, base=1.0):
    with CaptureWriter(p, arm=p.name, run={"what": "test"}) as w:
        for layer in range(3):
            w.add(base * torch.ones(4) * (scale if layer == 2 else 1.0), layer=layer, op="mlp", name="output")
    return str(p)


def test_compare_exit_codes_and_json(tmp_path, capsys):
    a = _cap(tmp_path / "a")
    b = _cap(tmp_path / "b", scale=1.5)
    assert main(["compare", a, a]) == 0
    assert "no divergence" in capsys.readouterr().out
    assert main(["compare", a, b, "--json", str(tmp_path / "r.json")]) == 1
    out = capsys.readouterr().out
    assert "first divergence: rank=0 step=0 layer=2 op=mlp name=output" in out
    assert json.loads((tmp_path / "r.json").read_text())["first_divergence"]["layer"] == 2
    assert main(["compare", a, b, "--rule", "mlp/*:max_abs=1.0"]) == 0
    # the rule's metric is the one judged: at layer 2, |3 - 2| = 1 (max_abs) but rel_l2 = 0.5
    c, d = _cap(tmp_path / "c", base=2.0), _cap(tmp_path / "d", scale=1.5, base=2.0)
    assert main(["compare", c, d, "--rule", "mlp/*:max_abs=0.8"]) == 1
    assert main(["compare", c, d, "--rule", "mlp/*:rel_l2=0.8"]) == 0
    assert main(["compare", c, d, "--rule", "mlp/*:rel_l2=0.4"]) == 1


def test_inspect_verify_and_errors(tmp_path, capsys):
    a = _cap(tmp_path / "a")
    assert main(["inspect", a, "--keys"]) == 0
    out = capsys.readouterr().out
    assert "tensors  3 in 1 shard(s)" in out and "what: test" in out
    assert main(["verify", a]) == 0
    shard = tmp_path / "a" / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")
    assert main(["verify", a]) == 1
    assert "sha256 mismatch" in capsys.readouterr().out
    assert main(["inspect", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: IncompleteCaptureError") and "fix:" in err


def test_console_script_is_installed(tmp_path):
    # the `workbench` entry point of the installed package, run as a user runs it
    import shutil
    from pathlib import Path

    exe = Path(sys.executable).parent / "workbench"
    exe = str(exe) if exe.exists() else shutil.which("workbench")
    assert exe is not None, "the workbench console script is not installed (pip install -e .)"
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "compare" in proc.stdout and "usage: workbench" in proc.stdout


