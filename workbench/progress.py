"""Progress bars for long work: tqdm in a terminal, tqdm's notebook bar in Jupyter, silent
otherwise.

A bar is shown when the output is a terminal (stderr is a TTY) or the code runs in a Jupyter
kernel that can show widgets, and never when ``WORKBENCH_QUIET=1`` (``workbench --quiet``
sets it), when :func:`quiet` is in force, or for work shorter than ``min_total`` items. Headless
notebook runs (``workbench run``, papermill) are quiet: the runner sets ``WORKBENCH_QUIET`` in
the kernel's environment so that executed notebooks hold results, not bars.

Example
-------
>>> from workbench.progress import progress
>>> for key in progress(keys, desc="compare", unit="key"):      # doctest: +SKIP
...     ...
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterable, Iterator, TypeVar

__all__ = ["progress", "counter", "quiet", "enabled", "QUIET_ENV"]

QUIET_ENV = "WORKBENCH_QUIET"
T = TypeVar("T")
_QUIET = [False]


def _in_jupyter() -> bool:
    ip = sys.modules.get("IPython")
    if ip is None:
        return False
    try:
        shell = ip.get_ipython()
    except Exception:  # noqa: BLE001 - no IPython shell
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def enabled() -> bool:
    """Whether a bar would be shown here and now."""
    if _QUIET[0] or os.environ.get(QUIET_ENV, "").strip() not in ("", "0"):
        return False
    if _in_jupyter():
        return True
    try:
        return sys.stderr is not None and sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def quiet(on: bool = True) -> Iterator[None]:
    """No bars inside this block (``quiet(False)``: bars as :func:`enabled` decides)."""
    old, _QUIET[0] = _QUIET[0], bool(on) or _QUIET[0]
    try:
        yield
    finally:
        _QUIET[0] = old


def progress(iterable: Iterable[T], *, total: int | None = None, desc: str = "", unit: str = "it",
             min_total: int = 2) -> Iterable[T]:
    """``iterable`` with a bar when :func:`enabled` (and ``total`` >= ``min_total``), else as is."""
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    if not enabled() or (total is not None and total < min_total):
        return iterable
    if _in_jupyter():
        try:
            from tqdm.notebook import tqdm as bar
        except ImportError:  # pragma: no cover - tqdm's notebook bar needs ipywidgets
            from tqdm import tqdm as bar
    else:
        from tqdm import tqdm as bar
    return bar(iterable, total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True)


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def write(self, text: str) -> None:
        print(text)


def counter(*, desc: str = "", unit: str = "it", total: int | None = None):
    """A bar to ``update()`` by hand (e.g. steps recorded, total unknown) and ``close()``; a
    no-op object when bars are off. ``write(text)`` prints without breaking the bar."""
    if not enabled():
        return _NoBar()
    if _in_jupyter():
        try:
            from tqdm.notebook import tqdm as bar
        except ImportError:  # pragma: no cover
            from tqdm import tqdm as bar
    else:
        from tqdm import tqdm as bar
    return bar(total=total, desc=desc, unit=unit, leave=False, dynamic_ncols=True)
