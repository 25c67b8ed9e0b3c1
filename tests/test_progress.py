"""Progress bars (on a terminal, quiet otherwise and with --quiet) and the CLI's cold start
(``--help`` and ``inspect`` import neither torch nor numba)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from workbench import progress as pg

ROOT = Path(__file__).resolve().parents[1]
CAPTURES = ROOT / "captures"


class _Tty:
    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, s):
        self.text += s
        return len(s)

    def flush(self):
        pass


def test_no_bar_when_not_a_terminal():
    items = list(range(10))
    assert pg.progress(items, desc="x") is items  # pytest's stderr is no TTY


def test_bar_on_a_terminal_and_quiet_switches(monkeypatch):
    tty = _Tty()
    monkeypatch.setattr(sys, "stderr", tty)
    monkeypatch.delenv(pg.QUIET_ENV, raising=False)
    assert pg.enabled()
    assert sum(pg.progress(range(5), desc="counting", unit="key")) == 10
    assert "counting" in tty.text
    with pg.quiet():
        assert not pg.enabled()
    assert pg.progress([1], desc="x") == [1]  # below min_total: no bar for tiny work
    monkeypatch.setenv(pg.QUIET_ENV, "1")
    assert not pg.enabled() and isinstance(pg.counter(desc="x"), pg._NoBar)


def _in_pty(args: list[str]) -> str:
    """Run ``python -m workbench.cli ARGS`` with stdout/stderr on a pseudo-terminal; its output."""
    main, child = pty.openpty()
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a terminal 120 columns wide
    env = {k: v for k, v in os.environ.items() if k != pg.QUIET_ENV}
    p = subprocess.Popen([sys.executable, "-m", "workbench.cli", *args], stdout=child, stderr=child, cwd=ROOT,
                         env=env, close_fds=True)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    p.wait(timeout=120)
    os.close(main)
    assert p.returncode in (0, 1), out.decode(errors="replace")
    return out.decode(errors="replace")


def test_compare_shows_progress_on_a_terminal_and_not_with_quiet():
    args = ["compare", str(CAPTURES / "control"), str(CAPTURES / "candidate"), "--rows", "1"]
    assert "compare control / candidate" in _in_pty(args)
    assert "compare control / candidate" not in _in_pty(["--quiet", *args])


@pytest.mark.parametrize("args", [["--help"], ["inspect", str(CAPTURES / "control")]], ids=["help", "inspect"])
def test_cold_start_imports_no_torch(args):
    code = ("import sys, contextlib, io\nfrom workbench.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main(%r)\n    except SystemExit:\n        pass\n"
            "heavy = [m for m in ('torch', 'numba', 'xarray', 'plotly') if m in sys.modules]\n"
            "assert not heavy, heavy\n") % (args,)
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=120)
