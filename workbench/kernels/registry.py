"""Registry of kernel backends.

Each kernel family (``gdn``, ``qsa``, ``gemm``) has implementations ("backends") living in
modules of ``workbench/kernels/<family>/``. A backend module exports the family's public op
functions with identical keyword signatures plus ``is_available() -> (bool, reason)``. The
registry imports a backend module only when it is asked for, so that listing backends does not
import numba or build native code.

Third parties add backends through the ``workbench.kernels`` entry-point group, with entries named
``<family>.<backend>`` pointing at a module; one that fails to import is listed as unavailable with
the import error as its reason (it never breaks the workbench). The mechanism is the one of
importers and replay adapters: :class:`workbench.plugins.Registry`.

A backend module declares the ops it implements itself in ``OPS`` (a tuple of op names; without
it, every public op it defines). Asking a backend for an op it does not implement is a
BackendUnavailableError that lists the backends that do; ``fallback=`` names one of them to run
instead, and each such substitution is warned about once (BackendFallbackWarning) and recorded
(:func:`fallbacks`): a result computed by torch is never labelled with another backend's name.
"""

from __future__ import annotations

import importlib
import threading
import warnings
from dataclasses import dataclass
from types import ModuleType

import pandas as pd

from workbench.errors import BackendUnavailableError, UnknownBackendError
from workbench.plugins import Registry

__all__ = ["register_backend", "get_backend", "get_op", "implemented_ops", "backends", "fallbacks",
           "BackendInfo", "BackendFallbackWarning", "REGISTRY"]


class BackendFallbackWarning(UserWarning):
    """An op ran on a fallback backend because the requested one does not implement it."""


@dataclass(frozen=True)
class BackendInfo:
    family: str
    name: str
    module: str
    install_hint: str
    description: str


# one registry of every family's backends, named "<family>.<backend>" (the entry-point names)
REGISTRY = Registry("kernel backend", "workbench.kernels", error=UnknownBackendError,
                    name_ok=lambda n: isinstance(n, str) and n.count(".") == 1 and all(n.split(".")))


def register_backend(
    family: str, name: str, module: str, *, install_hint: str = "", description: str = ""
) -> None:
    """Register ``module`` (a dotted path) as backend ``name`` of ``family``."""
    REGISTRY.register(f"{family}.{name}", module, source="builtin", install_hint=install_hint,
                      description=description)


def _family(family: str) -> dict[str, BackendInfo]:
    def members():
        out = {}
        for key in REGISTRY.names():
            fam, _, name = key.partition(".")
            if fam == family:
                e = REGISTRY.entry(key)
                out[name] = BackendInfo(fam, name, str(e.target), e.meta.get("install_hint", ""),
                                        e.meta.get("description", f"{e.source}"))
        return out

    fam = members()
    if not fam:
        # the family's package registers its backends on import
        try:
            importlib.import_module(f"workbench.kernels.{family}")
        except ModuleNotFoundError:
            pass
        fam = members()
    if not fam:
        raise UnknownBackendError(
            f"unknown kernel family {family!r}", key="family",
            fix=f"use one of {sorted({k.partition('.')[0] for k in REGISTRY.names()})}",
        )
    return fam


def _probe(info: BackendInfo) -> tuple[ModuleType | None, bool, str]:
    return REGISTRY.availability(f"{info.family}.{info.name}")


def get_backend(family: str, name: str) -> ModuleType:
    """The module implementing backend ``name`` of ``family``, or a clear error why it can't run."""
    fam = _family(family)
    if name not in fam:
        raise UnknownBackendError(
            f"unknown {family} backend {name!r}; must be one of {sorted(fam)}", key="backend",
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


def _module_ops(mod: ModuleType | None) -> tuple[str, ...]:
    if mod is None:
        return ()
    ops = getattr(mod, "OPS", None)
    if ops is None:
        ops = tuple(n for n in getattr(mod, "__all__", ()) if callable(getattr(mod, n, None))
                    and n != "is_available")
    return tuple(ops)


def _import(info: BackendInfo) -> ModuleType | None:
    """The backend's module (imported once; no availability probe), or None if it cannot import."""
    try:
        return REGISTRY.load(f"{info.family}.{info.name}")
    except UnknownBackendError:
        return None


def implemented_ops(family: str, name: str) -> tuple[str, ...]:
    """The ops backend ``name`` of ``family`` implements itself (its module's ``OPS``)."""
    fam = _family(family)
    if name not in fam:
        raise UnknownBackendError(f"unknown {family} backend {name!r}", key="backend",
                                  fix=f"use one of {sorted(fam)}")
    return _module_ops(_import(fam[name]))


_FALLBACKS: dict[tuple[str, str, str], str] = {}
_FALLBACK_LOCK = threading.Lock()


def get_op(family: str, backend: str, op: str, *, fallback: str | None = None):
    """The function implementing ``op`` in ``backend`` of ``family``.

    A backend that does not implement ``op`` is a BackendUnavailableError listing the backends
    that do, unless ``fallback`` names one of them: then that backend's function is returned, a
    BackendFallbackWarning is issued (once per family, backend and op) and the substitution is
    recorded in :func:`fallbacks`.
    """
    if op in implemented_ops(family, backend):  # UnknownBackendError for a name not registered
        return getattr(get_backend(family, backend), op)  # raises if it cannot run here
    fam = _family(family)
    who = [n for n in fam if op in implemented_ops(family, n)]
    if fallback is None:
        raise BackendUnavailableError(
            f"{family} backend {backend!r} does not implement {op}; backends that do: {who}", key="backend",
            fix=f"pass backend= one of {who}, or fallback={who[0]!r} to run {who[0]}'s {op} for this call "
                f"(recorded in workbench.kernels.fallbacks())" if who else "no backend implements it")
    if fallback not in who:
        raise BackendUnavailableError(
            f"fallback {fallback!r} does not implement {family}.{op} either; backends that do: {who}",
            key="fallback", fix=f"pass fallback= one of {who}")
    key = (family, backend, op)
    with _FALLBACK_LOCK:
        first = key not in _FALLBACKS
        _FALLBACKS[key] = fallback
    if first:
        warnings.warn(f"{family}.{op}: backend {backend!r} does not implement it; running {fallback!r}'s "
                      f"{op} instead (fallback={fallback!r})", BackendFallbackWarning, stacklevel=3)
    return get_op(family, fallback, op)


def fallbacks() -> list[dict]:
    """Every substitution made through ``fallback=`` in this process: family, op, the backend
    asked for and the one that ran."""
    with _FALLBACK_LOCK:
        return [dict(family=f, op=o, requested=b, ran=r) for (f, b, o), r in sorted(_FALLBACKS.items())]


def backends(family: str, *, by_op: bool = False) -> pd.DataFrame:
    """Every backend of ``family`` with its availability, the reason and the ops it implements.

    Returns a DataFrame with columns name, available, reason, ops, module, description; with
    ``by_op=True`` one row per (op, backend): op, name, implemented, available, reason.
    """
    rows = []
    for name, info in _family(family).items():
        mod, ok, reason = _probe(info)
        rows.append(dict(name=name, available=ok, reason=reason, ops=list(_module_ops(mod)), module=info.module,
                         description=info.description))
    df = pd.DataFrame(rows, columns=["name", "available", "reason", "ops", "module", "description"])
    if not by_op:
        return df
    all_ops = list(dict.fromkeys(o for r in rows for o in r["ops"]))
    long = [dict(op=o, name=r["name"], implemented=o in r["ops"], available=r["available"] and o in r["ops"],
                 reason=r["reason"] if o in r["ops"] else f"{r['name']} does not implement {o}")
            for o in all_ops for r in rows]
    return pd.DataFrame(long, columns=["op", "name", "implemented", "available", "reason"])
