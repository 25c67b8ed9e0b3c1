"""Registry of kernel backends.

Each kernel family (``gdn``, ``qsa``, ``gemm``) has implementations ("backends") living in
modules of ``workbench/kernels/<family>/``. A backend module exports the family's public op
functions with identical keyword signatures plus ``is_available() -> (bool, reason)``. The
registry imports a backend module only when it is asked for, so that listing backends does not
import numba or build native code.

Third parties add backends through the ``workbench.kernels`` entry-point group, with entries named
``<family>.<backend>`` pointing at a module; one that fails to import is listed as unavailable with
the import error as its reason (it never breaks the workbench).
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType

import pandas as pd

from workbench.errors import BackendUnavailableError, UnknownBackendError

__all__ = ["register_backend", "get_backend", "backends", "BackendInfo"]


@dataclass(frozen=True)
class BackendInfo:
    family: str
    name: str
    module: str
    install_hint: str
    description: str


_REGISTRY: dict[str, dict[str, BackendInfo]] = {}
_ENTRY_POINTS_LOADED = False


def register_backend(
    family: str, name: str, module: str, *, install_hint: str = "", description: str = ""
) -> None:
    """Register ``module`` (a dotted path) as backend ``name`` of ``family``."""
    _REGISTRY.setdefault(family, {})[name] = BackendInfo(family, name, module, install_hint, description)


def _load_entry_points() -> None:
    global _ENTRY_POINTS_LOADED
    if _ENTRY_POINTS_LOADED:
        return
    _ENTRY_POINTS_LOADED = True
    for ep in entry_points(group="workbench.kernels"):
        family, _, name = ep.name.partition(".")
        if not name:
            warnings.warn(
                f"ignoring workbench.kernels entry point {ep.name!r}: its name must be "
                "'<family>.<backend>'", stacklevel=2,
            )
            continue
        register_backend(family, name, ep.value, description=f"entry point {ep.name}")


def _family(family: str) -> dict[str, BackendInfo]:
    _load_entry_points()
    if family not in _REGISTRY:
        # the family's package registers its backends on import
        try:
            importlib.import_module(f"workbench.kernels.{family}")
        except ModuleNotFoundError:
            pass
    if family not in _REGISTRY:
        raise UnknownBackendError(
            f"unknown kernel family {family!r}", key="family",
            fix=f"use one of {sorted(_REGISTRY)}",
        )
    return _REGISTRY[family]


def _probe(info: BackendInfo) -> tuple[ModuleType | None, bool, str]:
    try:
        mod = importlib.import_module(info.module)
    except Exception as e:  # a broken optional backend must not break the rest
        return None, False, f"cannot import {info.module}: {type(e).__name__}: {e}"
    try:
        ok, reason = mod.is_available()
    except Exception as e:
        return mod, False, f"{info.module}.is_available() failed: {type(e).__name__}: {e}"
    return mod, bool(ok), str(reason)


def get_backend(family: str, name: str) -> ModuleType:
    """The module implementing backend ``name`` of ``family``, or a clear error why it can't run."""
    fam = _family(family)
    if name not in fam:
        raise UnknownBackendError(
            f"unknown {family} backend {name!r}", key="backend",
            fix=f"use one of {sorted(fam)}; workbench.kernels.backends({family!r}) lists them",
        )
    info = fam[name]
    mod, ok, reason = _probe(info)
    if not ok:
        raise BackendUnavailableError(
            f"{family} backend {name!r} cannot run here: {reason}", key="backend",
            fix=info.install_hint or "pick another backend from workbench.kernels.backends()",
        )
    return mod


def backends(family: str) -> pd.DataFrame:
    """Every backend of ``family`` with its availability and the reason.

    Returns a DataFrame with columns name, available, reason, module, description.
    """
    rows = []
    for name, info in _family(family).items():
        _, ok, reason = _probe(info)
        rows.append(dict(name=name, available=ok, reason=reason, module=info.module,
                         description=info.description))
    return pd.DataFrame(rows, columns=["name", "available", "reason", "module", "description"])
