"""One plugin mechanism: named things (kernel backends, capture importers, replay adapters) that
the workbench finds by name, loads lazily and asks whether they can run here.

A :class:`Registry` maps a name to a *target*: the object itself, or a ``"module:attr"`` (or
plain ``"module"``) path imported on first use, so that listing what exists imports nothing
heavy. Third parties add entries through the registry's entry-point group; an entry point that
fails to load is listed as unavailable with the reason and never breaks the workbench, and one
whose name is taken is ignored with a warning (a plugin cannot silently replace a built-in).

Availability is ``(ok, reason)``: the registry's ``verify(obj)`` (default: the object's own
``is_available()`` when it has one) answers it.

Example
-------
>>> reg = Registry("greeter", group=None)
>>> reg.register("hello", "string:capwords")
>>> reg.load("hello")("a b")
'A B'
>>> try:
...     reg.load("bye")
... except WorkbenchError as e:
...     print(e.message)
unknown greeter 'bye'; must be one of ['hello']
"""

from __future__ import annotations

import importlib
import threading
import warnings
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable

from workbench.errors import WorkbenchError

__all__ = ["Registry", "Entry", "PluginWarning"]


class PluginWarning(UserWarning):
    """A plugin could not be listed or loaded (the message says why)."""


@dataclass
class Entry:
    """One registered name: its target, where it came from and free-form metadata."""

    name: str
    target: Any
    source: str  # "builtin", "registered" or "entry point <value>"
    meta: dict = field(default_factory=dict)


def _import_target(path: str) -> Any:
    mod, _, attr = path.partition(":")
    obj = importlib.import_module(mod)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


def _default_verify(obj: Any) -> tuple[bool, str]:
    probe = getattr(obj, "is_available", None)
    if probe is None:
        return True, ""
    ok, reason = probe()
    return bool(ok), str(reason)


class Registry:
    """Names -> lazily loaded plugins, with entry points and ``(ok, reason)`` availability.

    Parameters
    ----------
    kind: what an entry is, for messages ("importer", "gdn backend", ...)
    group: the entry-point group third parties register in (None: none)
    check: ``check(obj) -> str | None``: why a loaded object is not a valid entry (None: valid)
    verify: ``verify(obj) -> (ok, reason)``: whether it can run here
    error: the WorkbenchError subclass raised for unknown or broken entries
    warning: the warning category of plugins that fail to load
    name_ok: ``name_ok(name) -> bool`` for names passed to :meth:`register`
    """

    def __init__(self, kind: str, group: str | None, *, check: Callable[[Any], str | None] | None = None,
                 verify: Callable[[Any], tuple[bool, str]] = _default_verify,
                 error: type[WorkbenchError] = WorkbenchError, warning: type[Warning] = PluginWarning,
                 name_ok: Callable[[str], bool] = lambda n: isinstance(n, str) and bool(n)) -> None:
        self.kind, self.group = kind, group
        self._check, self._verify, self._error, self._warning, self._name_ok = check, verify, error, warning, name_ok
        self._entries: dict[str, Entry] = {}
        self._loaded: dict[str, Any] = {}
        self._eps_loaded = group is None
        self._lock = threading.RLock()
        self.version = 0  # bumped whenever the set of entries changes (for callers' caches)

    # -- registration ---------------------------------------------------------------------------
    def register(self, name: str, target: Any, *, replace: bool = True, source: str = "registered",
                 **meta: Any) -> None:
        """Register ``target`` (an object or a ``"module:attr"`` path) as ``name``.

        With ``replace=False`` a name already taken by another target is an error.
        """
        if not self._name_ok(name):
            raise self._error(f"{self.kind} name {name!r} is not valid", key=str(name),
                              fix="use a short identifier such as 'myengine'")
        if isinstance(target, str):
            pass
        elif self._check is not None and (why := self._check(target)) is not None:
            raise self._error(f"{self.kind} {name!r}: {why}", key=name, fix=f"register a valid {self.kind}")
        with self._lock:
            cur = self._entries.get(name)
            if cur is not None and not replace and cur.target is not target:
                raise self._error(f"a {self.kind} named {name!r} is already registered ({cur.source})", key=name,
                                  fix="choose another name or pass replace=True")
            self._entries[name] = Entry(name, target, source, dict(meta))
            self._loaded.pop(name, None)
            self.version += 1

    def _load_entry_points(self) -> None:
        if self._eps_loaded:
            return
        self._eps_loaded = True
        try:
            eps = metadata.entry_points(group=self.group)
        except Exception as e:  # a broken distribution's metadata must not break the workbench
            warnings.warn(f"could not list {self.group!r} entry points: {type(e).__name__}: {e}",
                          self._warning, stacklevel=4)
            return
        for ep in eps:
            cur = self._entries.get(ep.name)
            if cur is not None:
                if not _same_target(cur.target, ep.value):
                    warnings.warn(f"{self.kind} entry point {ep.name!r} = {ep.value!r} is ignored: the name is "
                                  f"already taken by {cur.source} {self.kind} {cur.target!r}",
                                  self._warning, stacklevel=4)
                continue
            if not self._name_ok(ep.name):
                warnings.warn(f"ignoring {self.group} entry point {ep.name!r}: not a valid {self.kind} name",
                              self._warning, stacklevel=4)
                continue
            self._entries[ep.name] = Entry(ep.name, ep.value, f"entry point {ep.value}")
            self.version += 1

    # -- queries --------------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Every registered name (entry points included), in the order of registration."""
        with self._lock:
            self._load_entry_points()
            return list(self._entries)

    def __contains__(self, name: str) -> bool:
        return name in self.names()

    def entry(self, name: str) -> Entry:
        """The entry of ``name``; an unknown name is an error listing the valid ones."""
        with self._lock:
            self._load_entry_points()
            if name not in self._entries:
                valid = sorted(self._entries)
                raise self._error(f"unknown {self.kind} {name!r}; must be one of {valid}", key=str(name),
                                  fix=f"use one of {valid}" + (f", or register a plugin in the {self.group!r} "
                                                               "entry-point group" if self.group else ""))
            return self._entries[name]

    def load(self, name: str) -> Any:
        """The object registered as ``name`` (imported once); a target that fails to import or
        is not a valid entry is an error saying why."""
        e = self.entry(name)
        with self._lock:
            if name in self._loaded:
                return self._loaded[name]
            obj = e.target
            if isinstance(obj, str):
                try:
                    obj = _import_target(obj)
                except Exception as ex:
                    raise self._error(f"{self.kind} {name!r} ({e.source}) failed to load: {type(ex).__name__}: {ex}",
                                      key=name, fix="install the plugin's dependencies or uninstall the plugin") from ex
                why = self._check(obj) if self._check is not None else None
                if why is not None:
                    raise self._error(f"{self.kind} {name!r} ({e.source}) is {obj!r}: {why}", key=name,
                                      fix=f"the plugin's entry point must name a valid {self.kind}")
            self._loaded[name] = obj
            return obj

    def availability(self, name: str) -> tuple[Any | None, bool, str]:
        """``(obj, ok, reason)``: never raises for a broken entry (obj None, ok False, the reason)."""
        try:
            obj = self.load(name)
        except WorkbenchError as e:
            if name not in self.names():
                raise
            return None, False, e.message
        try:
            ok, reason = self._verify(obj)
        except Exception as ex:
            return obj, False, f"{self.kind} {name!r}: availability check raised {type(ex).__name__}: {ex}"
        return obj, bool(ok), str(reason)

    def get(self, name: str, *, unavailable: type[WorkbenchError] | None = None, fix: str = "") -> Any:
        """The object of ``name`` when it can run here, else an error with the reason."""
        obj, ok, reason = self.availability(name)
        if not ok:
            err = unavailable or self._error
            raise err(f"{self.kind} {name!r} cannot run here: {reason}", key=name,
                      fix=fix or self.entry(name).meta.get("install_hint") or "install what the reason names")
        return obj

    def rows(self, *, warn: bool = False) -> list[dict]:
        """One dict per entry: name, source, available, reason, meta (never raises)."""
        out = []
        for n in self.names():
            obj, ok, reason = self.availability(n)
            if obj is None and warn:
                warnings.warn(reason, self._warning, stacklevel=3)
            out.append(dict(name=n, source=self._entries[n].source, available=ok, reason=reason, obj=obj,
                            meta=self._entries[n].meta))
        return out

    def snapshot(self) -> tuple:
        """The registry's state, to :meth:`restore` it (tests)."""
        with self._lock:
            return dict(self._entries), dict(self._loaded), self._eps_loaded

    def restore(self, state: tuple, *, reload_entry_points: bool = False) -> None:
        with self._lock:
            entries, loaded, eps = state
            self._entries, self._loaded = dict(entries), dict(loaded)
            self.version += 1
            self._eps_loaded = False if reload_entry_points and self.group else eps


def _same_target(target: Any, value: str) -> bool:
    if isinstance(target, str):
        return target == value
    mod, qual = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    return f"{mod}:{qual}" == value or getattr(target, "__name__", None) == value
