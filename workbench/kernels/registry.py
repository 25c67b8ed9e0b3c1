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

A backend's op functions check their own arguments (shapes, dtypes, devices), since they can be
called directly; the public op functions of a family do not check them again on the hot path.
No check reads a device value (that would stop CUDA-graph capture and cost a synchronization);
value checks that must read the device run only in an explicit debug mode (``check=True``).

A backend module declares the ops it implements itself in ``OPS`` (a tuple of op names; without
it, every public op it defines). Asking a backend for an op it does not implement is a
BackendUnavailableError that lists the backends that do; ``fallback=`` names one of them to run
instead, and each such substitution is warned about once (BackendFallbackWarning) and recorded
(:func:`fallbacks`): a result computed by torch is never labelled with another backend's name.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import threading
import time
import warnings
from dataclasses import dataclass
from types import ModuleType

import pandas as pd

from workbench.errors import BackendUnavailableError, UnknownBackendError
from workbench.plugins import Registry

__all__ = ["register_backend", "register_knobs", "get_backend", "get_op", "implemented_ops", "backends",
           "fallbacks", "call", "backend_op", "check_policy", "honoured_knobs", "devices", "note_path", "kernel_log", "KernelLog",
           "resolve_device", "to_device", "placed", "runnable",
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


_FAMILIES: dict[str, tuple[int, dict[str, BackendInfo]]] = {}  # family -> (REGISTRY.version, members)


def _family(family: str) -> dict[str, BackendInfo]:
    """The backends of ``family`` (name -> info), rebuilt only when the registry changed: every
    kernel call asks for them."""
    cached = _FAMILIES.get(family)
    if cached is not None and cached[0] == REGISTRY.version:
        return cached[1]

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
    _FAMILIES[family] = (REGISTRY.version, fam)
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


def _runner_of(family: str, backend: str, op: str, fallback: str | None) -> str:
    """The backend that runs ``op``: ``backend`` itself, or ``fallback`` (warned once, recorded)."""
    if op in implemented_ops(family, backend):  # UnknownBackendError for a name not registered
        return backend
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
                      f"{op} instead (fallback={fallback!r})", BackendFallbackWarning, stacklevel=4)
    return fallback


def get_op(family: str, backend: str, op: str, *, fallback: str | None = None):
    """The function implementing ``op`` in ``backend`` of ``family``.

    A backend that does not implement ``op`` is a BackendUnavailableError listing the backends
    that do, unless ``fallback`` names one of them: then that backend's function is returned, a
    BackendFallbackWarning is issued (once per family, backend and op) and the substitution is
    recorded in :func:`fallbacks`.
    """
    return getattr(get_backend(family, _runner_of(family, backend, op, fallback)), op)


def fallbacks() -> list[dict]:
    """Every substitution made through ``fallback=`` in this process: family, op, the backend
    asked for and the one that ran."""
    with _FALLBACK_LOCK:
        return [dict(family=f, op=o, requested=b, ran=r) for (f, b, o), r in sorted(_FALLBACKS.items())]


def backends(family: str, *, by_op: bool = False) -> pd.DataFrame:
    """Every backend of ``family`` with its availability, the reason and the ops it implements.

    Returns a DataFrame with columns name, available, reason, ops, devices, knobs (the values of each of
    the family's policy knobs the backend honours: "any" or a list), module, description; with
    ``by_op=True`` one row per (op, backend): op, name, implemented, available, reason.
    """
    rows = []
    for name, info in _family(family).items():
        mod, ok, reason = _probe(info)
        knobs = honoured_knobs(family, name)
        rows.append(dict(name=name, available=ok, reason=reason, ops=list(_module_ops(mod)),
                         devices=list(devices(family, name)),
                         knobs="policy does not apply (FP64 truth)" if knobs is None else
                         {k: ("any" if v is None else _text(v) if isinstance(v, range) else list(v))
                          for k, v in knobs.items()},
                         module=info.module, description=info.description))
    df = pd.DataFrame(rows, columns=["name", "available", "reason", "ops", "devices", "knobs", "module",
                                     "description"])
    if not by_op:
        return df
    all_ops = list(dict.fromkeys(o for r in rows for o in r["ops"]))
    long = [dict(op=o, name=r["name"], implemented=o in r["ops"], available=r["available"] and o in r["ops"],
                 reason=r["reason"] if o in r["ops"] else f"{r['name']} does not implement {o}")
            for o in all_ops for r in rows]
    return pd.DataFrame(long, columns=["op", "name", "implemented", "available", "reason"])


# -- policy knobs and the dispatcher --------------------------------------------------------------
#
# A family declares the policy knobs its ops read (``register_knobs``); a backend module declares
# in ``KNOBS`` the values it honours of each (``{knob: values}``; None: any value; a knob it does
# not list: only the default). ``KNOBS = None`` says the policy does not apply to the backend at
# all (the FP64 oracles). The dispatcher checks a call's policy against that table once, before
# the backend runs; a knob a backend cannot honour is always a PolicyError naming the backends
# that can.

_FAMILY_KNOBS: dict[str, dict[str | None, tuple[str, ...]]] = {}


def register_knobs(family: str, knobs) -> None:
    """Declare the policy knobs the ops of ``family`` read: a tuple (every op), or
    ``{op: tuple}``."""
    from workbench.numerics.policy import Policy
    per_op = dict(knobs) if isinstance(knobs, dict) else {None: tuple(knobs)}
    bad = sorted({k for ks in per_op.values() for k in ks} - set(Policy.knobs()))
    if bad:
        raise UnknownBackendError(f"{family}: {bad} are not policy knobs", key="knobs",
                                  fix=f"use knobs among {Policy.knobs()}")
    _FAMILY_KNOBS[family] = {op: tuple(ks) for op, ks in per_op.items()}


def _family_knobs(family: str, op: str | None) -> tuple[str, ...]:
    table = _FAMILY_KNOBS.get(family, {})
    if op is None:
        return tuple(dict.fromkeys(k for ks in table.values() for k in ks))
    return table.get(op, table.get(None, ()))


def honoured_knobs(family: str, name: str, op: str | None = None) -> dict[str, tuple | None] | None:
    """``{knob: values honoured (None: any)}`` of backend ``name`` for the knobs ``op`` of
    ``family`` reads (None: every op's); None when the policy does not apply to the backend
    (an FP64 oracle)."""
    from workbench.numerics.policy import DEFAULT
    mod = _module(family, name)
    declared = getattr(mod, "KNOBS", {}) if mod is not None else {}
    if declared is None:
        return None
    return {k: (_values(declared[k]) if declared[k] is not None else None) if k in declared
            else (getattr(DEFAULT, k),) for k in _family_knobs(family, op)}


def _values(v):
    return v if isinstance(v, range) else tuple(v)


def _text(values) -> str:
    if isinstance(values, range):
        return f"{values.start}..{values.stop - 1}"
    return repr(list(values))


def check_policy(family: str, name: str, policy, op: str | None = None) -> None:
    """PolicyError when backend ``name`` cannot honour a knob of ``policy`` that ``op`` reads."""
    from workbench.errors import PolicyError
    table = honoured_knobs(family, name, op)
    if table is None:
        return
    for knob, values in table.items():
        v = getattr(policy, knob)
        if values is not None and v not in values:
            who = [n for n in _family(family) if n != name and (op is None or op in implemented_ops(family, n))
                   and _honours(family, n, op, knob, v)]
            raise PolicyError(
                f"{family} backend {name!r} does not honour policy.{knob}={v!r} (it honours {_text(values)}); "
                f"backends that do: {who}", key=knob,
                fix=(f"pass backend= one of {who}, or " if who else "") + f"set {knob}= one of {_text(values)}")


def devices(family: str, name: str) -> tuple[str, ...]:
    """The torch device types backend ``name`` runs on (its module's ``DEVICES``; default cpu and cuda)."""
    return tuple(getattr(_module(family, name), "DEVICES", ("cpu", "cuda")))


def _module(family: str, name: str) -> ModuleType | None:
    fam = _family(family)
    return _import(fam[name]) if name in fam else None


def _honours(family: str, name: str, op: str | None, knob: str, value) -> bool:
    t = honoured_knobs(family, name, op)
    return t is not None and (t.get(knob) is None or value in t[knob])


_DISPATCH: dict[tuple, tuple] = {}  # (family, backend, op, fallback) -> (REGISTRY.version, ran, fn, takes_policy)
_CHECKED: dict[tuple, tuple] = {}  # (family, ran, op, id(policy)) honoured -> (policy, REGISTRY.version)


def _dispatch(family: str, backend: str, op: str, fallback: str | None, p) -> tuple[str, object, bool]:
    """The backend that runs ``op``, its function and whether it takes a policy, with the policy
    checked against what it honours first (a refused knob is a PolicyError even where the backend
    cannot run): resolved once per registry version, since a public kernel call must cost
    microseconds, not a registry walk."""
    key = (family, backend, op, fallback)
    hit = _DISPATCH.get(key)
    if hit is not None and hit[0] == REGISTRY.version:
        _checked(family, hit[1], p, op)
        return hit[1], hit[2], hit[3]
    ran = _runner_of(family, backend, op, fallback)
    _checked(family, ran, p, op)
    fn = getattr(get_backend(family, ran), op)
    takes = bool(_family_knobs(family, op)) or op not in _FAMILY_KNOBS.get(family, {})
    if fallback is None or ran == backend:  # a fallback warns once per process: cache it too
        _DISPATCH[key] = (REGISTRY.version, ran, fn, takes)
    return ran, fn, takes


def _checked(family: str, ran: str, p, op: str) -> None:
    """:func:`check_policy`, remembered for a policy object already found honoured (keyed by the
    object's identity, which the cache keeps alive, so that no other policy can take its id;
    hashing a policy's every knob on each call would cost more than the check saves)."""
    key = (family, ran, op, id(p))
    hit = _CHECKED.get(key)
    if hit is not None and hit[0] is p and hit[1] == REGISTRY.version:
        return
    check_policy(family, ran, p, op)
    if len(_CHECKED) > 4096:
        _CHECKED.clear()
    _CHECKED[key] = (p, REGISTRY.version)


_POLICY: tuple | None = None  # (Policy, resolve_policy), imported on the first call


def _import_policy() -> None:
    global _POLICY
    from workbench.numerics.policy import Policy, resolve_policy
    _POLICY = (Policy, resolve_policy)


def call(family: str, backend: str, op: str, *args, policy=None, fallback: str | None = None,
         knobs: dict | None = None, **kwargs):
    """Run ``op`` of ``family`` on ``backend``: the one place a kernel call's policy is resolved
    (None: the current one; a dict: knobs over it) and checked against what the backend
    honours, the backend chosen (or its fallback) and the call noted in every open
    :func:`kernel_log` (timed there when the log asks). ``knobs``: the call's explicit arguments
    that are policy knobs (``chunk_size=``, ``splits=``; None values ignored), checked as part of
    the policy. The backend function receives the resolved :class:`Policy`.

    What is resolved once (the backend, its function, a policy found honoured) is remembered per
    registry version, so a call costs a few microseconds over the backend function itself; the
    call reads no device value, so it can be captured in a CUDA graph when the backend can."""
    if _POLICY is None:
        _import_policy()
    p = policy if type(policy) is _POLICY[0] else _POLICY[1](policy)
    if knobs:
        given = {k: v for k, v in knobs.items() if v is not None}
        if given:
            p = p.replace(**given)
    ran, fn, takes = _dispatch(family, backend, op, fallback, p)
    logs = _LOGS.get()
    if takes:
        kwargs["policy"] = p  # an op declared to read no knob (qsa.select) takes no policy
    if not logs:
        return fn(*args, **kwargs)
    event = {"family": family, "op": op, "backend": backend, "ran": ran, "policy": p.label(), "path": None}
    clock = _Clock(event, args) if any(log.timing for log in logs) else None
    token = _CURRENT.set(event)
    try:
        if clock is None:
            return fn(*args, **kwargs)
        with clock:
            return fn(*args, **kwargs)
    finally:
        _CURRENT.reset(token)
        for log in logs:
            log._add(event)


def _first_tensor(args):
    import torch
    for a in args:
        if isinstance(a, torch.Tensor):
            return a
        if isinstance(a, (tuple, list)):
            t = _first_tensor(a)
            if t is not None:
                return t
    return None


_SEEN: set = set()  # (family, op, ran, device, dtype) already called once in this process
_SEEN_LOCK = threading.Lock()


class _Clock:
    """Times one kernel call for a timing :func:`kernel_log`: wall time, the device synchronized
    before and after on CUDA (never while a CUDA graph is being captured: then the call is
    counted, not timed). The first call of a (family, op, backend, device, dtype) in the process
    is marked ``first``: it carries the one-time cost (numba's JIT, the native build or its
    load from the on-disk cache)."""

    def __init__(self, event: dict, args) -> None:
        t = _first_tensor(args)
        self.event = event
        self.device = t.device.type if t is not None else "none"
        self.sync = None
        if self.device == "cuda":
            import torch
            if not torch.cuda.is_current_stream_capturing():
                self.sync = torch.cuda.synchronize
        self.capturing = self.device == "cuda" and self.sync is None
        self.key = (event["family"], event["op"], event["ran"], self.device, str(t.dtype) if t is not None else "")

    def __enter__(self):
        if self.sync is not None:
            self.sync()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.sync is not None and exc[0] is None:
            self.sync()
        dt = time.perf_counter() - self.t0
        self.event["device"] = self.device
        if self.capturing or exc[0] is not None:
            return
        with _SEEN_LOCK:
            first = self.key not in _SEEN
            _SEEN.add(self.key)
        self.event["seconds"] = dt
        self.event["first"] = first


def backend_op(fn):
    """Decorator of a backend's op functions. Through the dispatcher they receive the resolved
    :class:`Policy`; called directly (tests, benchmarks, one backend's helper calling another of
    its ops) their ``policy=`` (None: the current one, or a dict) is resolved here, the same way,
    so the backend code only ever reads a Policy. Nothing is checked here: what a backend
    honours is checked by :func:`call`."""
    from workbench.numerics.policy import Policy, resolve_policy

    @functools.wraps(fn)
    def op(*args, policy=None, **kwargs):
        return fn(*args, policy=policy if isinstance(policy, Policy) else resolve_policy(policy), **kwargs)
    return op


def note_path(path) -> None:
    """Called by a backend inside a dispatched call: the code path it took (e.g. "mma" or
    "scalar" for the tensor-core choice), recorded with the call in :func:`kernel_log`. ``path``
    may be a function returning it, called only when a log is recording (work the call itself
    does not need stays off the hot path)."""
    ev = _CURRENT.get()
    if ev is not None:
        ev["path"] = path() if callable(path) else path


class KernelLog:
    """The kernel calls made inside a :func:`kernel_log` block, grouped: family, op, the backend
    asked for, the one that ran, the policy label, the path taken, and how many calls; with
    ``timing=True`` also each call's time (:meth:`timings`)."""

    def __init__(self, timing: bool = False) -> None:
        self.timing = bool(timing)
        self._counts: dict[tuple, int] = {}
        self._times: dict[tuple, tuple[list, list]] = {}  # (family, op, ran, device) -> (first, later)
        self._lock = threading.Lock()

    def _add(self, ev: dict) -> None:
        key = tuple(ev[k] for k in _LOG_FIELDS)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0) + 1
            if "seconds" in ev:
                first, later = self._times.setdefault((ev["family"], ev["op"], ev["ran"], ev["device"]), ([], []))
                (first if ev["first"] else later).append(ev["seconds"])

    def summary(self) -> list[dict]:
        with self._lock:
            return [dict(zip(_LOG_FIELDS, k), calls=n) for k, n in self._counts.items()]

    def timings(self) -> list[dict]:
        """Per (family, op, backend that ran, device): ``calls`` timed, ``first_calls`` (calls
        that were the process's first of their dtype: they pay numba's JIT, the native build or
        its load from the on-disk cache), ``kernel_s`` (the median of the other calls: the time
        a call takes once built; NaN when every call was a first one), ``one_time_s`` (what the
        first calls took beyond ``kernel_s`` each) and ``total_s``. Empty unless the log was
        opened with ``timing=True``. On CUDA the device is synchronized around each call, so
        these are kernel times plus launch cost, not overlapped throughput."""
        import statistics
        with self._lock:
            items = {k: (list(f), list(l)) for k, (f, l) in self._times.items()}
        out = []
        for (fam, op, ran, dev), (first, later) in items.items():
            med = statistics.median(later) if later else float("nan")
            one = (sum(first) - len(first) * med) if later else sum(first)
            out.append(dict(family=fam, op=op, backend=ran, device=dev, calls=len(first) + len(later),
                            first_calls=len(first), kernel_s=med, one_time_s=max(one, 0.0),
                            total_s=sum(first) + sum(later)))
        return out

    @property
    def fallbacks(self) -> list[dict]:
        """The calls that ran another backend than the one asked for."""
        return [r for r in self.summary() if r["backend"] != r["ran"]]

    def __repr__(self) -> str:
        return f"<KernelLog {sum(self._counts.values())} calls, {len(self._counts)} kinds>"


_LOG_FIELDS = ("family", "op", "backend", "ran", "policy", "path")
_CURRENT: contextvars.ContextVar[dict | None] = contextvars.ContextVar("workbench_kernel_call", default=None)
_LOGS: contextvars.ContextVar[tuple] = contextvars.ContextVar("workbench_kernel_logs", default=())


@contextlib.contextmanager
def kernel_log(*, timing: bool = False):
    """Record the kernel calls made inside the block (in this thread or task)::

        with kernel_log() as log:
            model.generate(...)
        log.summary()   # [{'family': 'gdn', 'op': 'chunked', 'backend': 'ext', 'ran': 'ext',
                        #   'policy': 'default', 'path': 'mma', 'calls': 4}, ...]

    Results record it (capture run metadata ``kernels``, replay attrs), so a result says which
    code computed it. ``timing=True`` also times every call (synchronizing the GPU around each,
    so only for reports, not for a model's own speed): :meth:`KernelLog.timings` separates the
    one-time JIT/build cost from the kernel time.
    """
    log = KernelLog(timing)
    token = _LOGS.set(_LOGS.get() + (log,))
    try:
        yield log
    finally:
        _LOGS.reset(token)


# -- where kernels run ----------------------------------------------------------------------------

def resolve_device(device: str | None = "auto"):
    """The torch device a notebook or analysis runs its kernels on: ``"auto"`` (or "" / None)
    is ``cuda`` when torch sees a GPU, else ``cpu``; ``"cpu"``, ``"cuda"``, ``"cuda:1"`` as
    given. Asking for a GPU that is not there is a BackendUnavailableError naming the fix."""
    import torch
    spec = (device or "auto").strip() if isinstance(device, str) else device
    if spec == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError) as e:
        raise BackendUnavailableError(f"device {device!r} is not a torch device ({e})", key="device",
                                      fix='pass device="auto", "cpu" or "cuda"') from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailableError(f"device {device!r}: torch sees no CUDA GPU here "
                                          f"(torch {torch.__version__})", key="device",
                                          fix='pass device="auto" (the GPU when there is one) or "cpu"')
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise BackendUnavailableError(f"device {device!r}: only {torch.cuda.device_count()} GPU(s) here",
                                          key="device", fix='pass device="cuda" (the first GPU)')
    return dev


def to_device(obj, device):
    """``obj`` with every tensor in it (nested in tuples, lists and dicts) moved to ``device``."""
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: to_device(v, device) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_device(v, device) for v in obj)
    return obj


def placed(device, *tensors):
    """``(device, tensors moved there)``: ``device`` resolved by :func:`resolve_device`, None
    meaning the first tensor's own device; a None among ``tensors`` stays None. The analyses
    that run a backend on a device keep their oracle on the inputs as given and hand the backend
    these."""
    dev = resolve_device(device) if device is not None else tensors[0].device
    return dev, [None if t is None else t.to(dev) for t in tensors]


def runnable(family: str, names, device) -> tuple[list[str], dict[str, str]]:
    """Which of the backends ``names`` of ``family`` can run on ``device`` here: ``(runnable,
    {skipped name: reason})``, in the order given. A backend is skipped when it cannot run here
    at all (its ``is_available`` reason) or does not take tensors of that device type (its
    ``DEVICES``). A name that is not a backend of the family is an UnknownBackendError (a typo
    must not pass as a skip)."""
    import torch
    dev = device if isinstance(device, torch.device) else torch.device(device)
    fam = _family(family)
    ok, skipped = [], {}
    for name in dict.fromkeys(names):
        if name not in fam:
            raise UnknownBackendError(f"unknown {family} backend {name!r}; must be one of {sorted(fam)}",
                                      key="backend", fix=f"use one of {sorted(fam)}")
        _, avail, reason = _probe(fam[name])
        if not avail:
            skipped[name] = f"cannot run here: {reason}"
        elif dev.type not in devices(family, name):
            skipped[name] = (f"runs on {' or '.join(devices(family, name))} tensors, and the device is {dev.type} "
                             f"(pass device=\"cuda\" on a GPU machine)" if "cuda" in devices(family, name)
                             else f"runs on {' or '.join(devices(family, name))} tensors, not {dev.type}")
        else:
            ok.append(name)
    return ok, skipped
