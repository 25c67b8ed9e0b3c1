"""Importer base class and registry (built-ins plus the ``workbench.importers`` entry points)."""

from __future__ import annotations

import inspect
import re
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from workbench.errors import ImporterError
from workbench.plugins import PluginWarning, Registry

__all__ = ["Importer", "ImporterInfo", "ImporterWarning", "ENTRY_POINT_GROUP", "REGISTRY", "register_importer",
           "importers", "get_importer", "import_capture"]

ENTRY_POINT_GROUP = "workbench.importers"

# Built-ins are named by dotted path so that listing importers does not import torch-heavy code.
_BUILTIN = {
    "sglang": "workbench.capture.importers.sglang:SGLangImporter",
    "folder": "workbench.capture.importers.folder:FolderImporter",
    "flashinfer": "workbench.capture.importers.flashinfer:FlashInferImporter",
    "vllm-hidden-states": "workbench.capture.importers.vllm_hidden_states:VLLMHiddenStatesImporter",
}


class ImporterWarning(PluginWarning):
    """An importer plugin could not be loaded (the message says why)."""


class Importer:
    """Base class of capture importers: turn a foreign dump ``src`` into a capture at ``dst``.

    Subclasses set :attr:`name` and :attr:`description` and implement :meth:`run`, with their
    options as keyword-only arguments (``import_capture`` checks option names against that
    signature and lists the valid ones on a typo). A plugin whose dependencies are missing
    overrides :meth:`is_available` to say why instead of failing on import.

    Example
    -------
    >>> class MyImporter(Importer):                                       # doctest: +SKIP
    ...     name = "mine"
    ...     description = "one .bin per tensor"
    ...     def run(self, src, dst, *, arm=None, run=None, overwrite=False):
    ...         with CaptureWriter(dst, arm=arm or "imported", run=run) as w: ...
    ...         return Path(dst)
    >>> register_importer("mine", MyImporter)                            # doctest: +SKIP
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @classmethod
    def is_available(cls) -> tuple[bool, str]:
        """(True, "") when the importer can run here, else (False, reason)."""
        return True, ""

    def run(self, src: str | os.PathLike, dst: str | os.PathLike, *, arm: str | None = None,
            run: dict | None = None, **options: Any) -> Path:
        raise NotImplementedError


@dataclass(frozen=True)
class ImporterInfo:
    """One row of :func:`importers`: whether the importer loads, and why not."""

    name: str
    description: str
    available: bool
    reason: str
    source: str  # "builtin", "registered" or "entry point <module:attr>"


def _name_ok(name) -> bool:
    """An importer kind: letters, digits, ``_`` and ``-``, starting with a letter (``vllm-hidden-states``)."""
    return isinstance(name, str) and bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,63}", name))


def _check_importer(obj) -> str | None:
    return None if isinstance(obj, type) and issubclass(obj, Importer) else "not an Importer subclass"


def _importer_available(cls) -> tuple[bool, str]:
    ok, reason = cls.is_available()
    return bool(ok), str(reason)


REGISTRY = Registry("importer", ENTRY_POINT_GROUP, check=_check_importer, verify=_importer_available,
                    error=ImporterError, warning=ImporterWarning, name_ok=_name_ok)
for _n, _t in _BUILTIN.items():
    REGISTRY.register(_n, _t, source="builtin")


def register_importer(name: str, cls: type[Importer] | str, *, replace: bool = False) -> None:
    """Register an importer class (or a ``"module:Class"`` path) under ``name``."""
    REGISTRY.register(name, cls, replace=replace)


def importers() -> list[ImporterInfo]:
    """All known importers with their description and availability (never raises).

    An importer that fails to load is listed as unavailable, with the reason, and a warning.
    """
    return [ImporterInfo(r["name"], getattr(r["obj"], "description", "") if r["obj"] is not None else "",
                         r["available"], r["reason"], r["source"])
            for r in sorted(REGISTRY.rows(warn=True), key=lambda r: r["name"])]


def get_importer(kind: str) -> Importer:
    """An instance of the importer registered as ``kind``."""
    return REGISTRY.get(kind, fix="install what the reason names")()


def import_capture(kind: str, src: str | os.PathLike, dst: str | os.PathLike, **options: Any):
    """Import a foreign dump ``src`` into a new capture at ``dst`` and open it.

    Parameters
    ----------
    kind: importer name (``sglang``, ``folder``, ``flashinfer`` or a plugin; see :func:`importers`)
    src: the dump (a directory)
    dst: the capture directory to create
    options: ``arm=``, ``run=`` and the importer's own keyword options

    Returns
    -------
    Capture

    Example
    -------
    >>> cap = import_capture("folder", "dumps/", "cap/", arm="control",            # doctest: +SKIP
    ...                      pattern="rank{rank}/step{step}/{op}.{layer}.{name}.pt")
    """
    from workbench.capture.reader import open_capture

    imp = get_importer(kind)
    sig = inspect.signature(imp.run)
    if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        valid = [n for n, p in sig.parameters.items() if p.kind is p.KEYWORD_ONLY]
        bad = sorted(set(options) - set(valid))
        if bad:
            raise ImporterError(f"importer {kind!r} has no option(s) {bad}; valid options are {valid}",
                                key=kind, fix=f"pass only {valid}")
    missing = [n for n, p in sig.parameters.items()
               if p.kind is p.KEYWORD_ONLY and p.default is p.empty and n not in options]
    if missing:
        raise ImporterError(f"importer {kind!r} needs option(s) {missing}", key=missing[0],
                            fix=f"pass {missing[0]}=... (on the command line: --{missing[0]} ... or -o {missing[0]}=...)")
    options = {k: _coerce(kind, sig.parameters.get(k), k, v) for k, v in options.items()}
    _check_overlap(src, dst)
    existed = os.path.lexists(dst)
    try:
        path = imp.run(src, dst, **options)
    except BaseException:
        if not existed:
            _remove_unfinished(Path(dst))
        raise
    return open_capture(path)


def _remove_unfinished(dst: Path) -> None:
    """A failed import leaves no half-written destination: remove the incomplete capture it
    started (only that: a directory holding the writer's marker and no manifest)."""
    import shutil

    from workbench.capture.format import MANIFEST
    from workbench.capture.writer import MARKER

    if dst.is_dir() and not dst.is_symlink() and (dst / MARKER).exists() and not (dst / MANIFEST).exists():
        shutil.rmtree(dst, ignore_errors=True)


def _check_overlap(src, dst) -> None:
    """Refuse a destination that is, contains or lies inside the source: writing it (or
    overwriting it) would change or delete the dump being read."""
    s, d = Path(src).resolve(), Path(dst).resolve()
    if s == d or s in d.parents or d in s.parents:
        how = "is" if s == d else ("is inside" if s in d.parents else "contains")
        raise ImporterError(f"the destination {how} the dump being imported", file=d, key="dst",
                            fix="write the capture to a directory outside the dump (e.g. beside it)")


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _coerce(kind: str, param, name: str, value: Any) -> Any:
    """Command-line options arrive as text: convert to the type of the option's default."""
    if param is None or not isinstance(value, str):
        return value
    default = param.default
    if isinstance(default, bool):
        if value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ImporterError(f"option {name}={value!r} of importer {kind!r} must be true or false", key=name,
                            fix=f"write {name}=true or {name}=false")
    for typ, what in ((int, "an integer"), (float, "a number")):
        if isinstance(default, typ):
            try:
                return typ(value)
            except ValueError:
                raise ImporterError(f"option {name}={value!r} of importer {kind!r} must be {what}", key=name,
                                    fix=f"write {name}=<{what.split()[-1]}>") from None
    return value
