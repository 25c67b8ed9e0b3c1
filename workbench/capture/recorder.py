"""record(): capture a torch model's module inputs and outputs through forward hooks.

Keys
----
* step: one forward call of the root module is one step (0, 1, 2, ...: prefill then each
  decode step under ``generate``). A submodule called outside a root forward is recorded under
  the step of the next root call.
* layer and op from the module path: the integer after the first ``layers``/``h``/``blocks``/
  ``layer`` component is the layer and the rest of the path is the op
  (``model.layers.3.linear_attn.in_proj_qkvz`` -> layer 3, op ``linear_attn.in_proj_qkvz``;
  ``model.layers.3`` -> layer 3, op ``layer``); other modules get layer -1 and their full path
  as op (``lm_head``, ``model.norm``); the root module is op ``root``. ``mapper(path, module)
  -> (layer, op)`` overrides this (return None to keep the default for a module).
* name, from the call's arguments (recorded before the forward runs) and its result:

  =============================  =========================================================
  positional argument 0          ``input`` (a tensor) or ``input.0.<i>`` (inside a tuple/list/dict)
  positional argument i >= 1     ``input.<i>``, nested ``input.<i>.<j>``
  keyword argument k             ``input.<k>``, nested ``input.<k>.<j>``
  result                         ``output`` (a tensor); ``output.<i>`` / ``output.<key>`` for
                                 tuples, lists, dicts and ModelOutput, nested ``output.0.1``
  =============================  =========================================================

  Non-tensor leaves (None, ints, caches, ...) are ignored; so are tensors of dtypes a capture
  cannot hold (counted in the run metadata). The second, third, ... call of a module (more
  exactly, of its (layer, op)) within one step gets ``#1``, ``#2``... appended to each name.
* seq: the order in which tensors were produced (inputs when a call starts, outputs when it ends).

Byte cap
--------
With ``max_bytes``, the first tensor that would take the capture past the cap stops recording:
nothing more is written. With ``on_budget="raise"`` (default) a CaptureBudgetError is raised when
the root forward that hit the cap returns (its result is lost; the exception leaves the ``with``
block). With ``on_budget="warn"`` a warning is issued and the model runs on unrecorded. Either way
the capture is committed and valid, holding everything recorded up to the cap, and its run
metadata says ``truncated: true`` and where it stopped.

Any other exception inside the block leaves no manifest (as with CaptureWriter). Hooks are always
removed on exit.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import os
import re
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol

import torch

from workbench.capture.format import TORCH_TO_NAME
from workbench.capture.writer import DEFAULT_SHARD_BYTES, CaptureWriter
from workbench.errors import CaptureBudgetError, CaptureError, DuplicateKeyError, GraftError

__all__ = ["record", "Recorder", "Rerun", "ModelRerun", "split_module_path", "LAYER_CONTAINERS"]

LAYER_CONTAINERS = ("layers", "h", "blocks", "layer")
_UINT = re.compile(r"[0-9]+")
_MAX_DEPTH = 6
ON_BUDGET = ("raise", "warn")

Filter = str | list | tuple | Callable[[str, torch.nn.Module], bool] | None


def _world() -> dict:
    """This process's place in torch.distributed (empty when it is not initialised)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return {"world_rank": int(dist.get_rank()), "world_size": int(dist.get_world_size())}
    return {}


@functools.lru_cache(maxsize=1)
def _has_cuda() -> bool:
    return bool(torch.cuda.is_available())


def _capturing_cuda_graph() -> bool:
    """Whether the current CUDA stream is capturing a graph (False without CUDA; asked per
    tensor, so CUDA's availability is looked up once)."""
    try:
        return _has_cuda() and bool(torch.cuda.is_current_stream_capturing())
    except Exception:
        return False


def split_module_path(path: str) -> tuple[int | None, str]:
    """(layer, op) of a dotted module path; layer is None when the path has no layer index.

    >>> split_module_path("model.layers.3.linear_attn.in_proj_qkvz")
    (3, 'linear_attn.in_proj_qkvz')
    >>> split_module_path("lm_head")
    (None, 'lm_head')
    """
    parts = path.split(".") if path else []
    for i in range(len(parts) - 1):
        if parts[i] in LAYER_CONTAINERS and _UINT.fullmatch(parts[i + 1]):
            rest = parts[i + 2:]
            return int(parts[i + 1]), ".".join(rest) if rest else "layer"
    return None, path


def _matcher(spec: Filter, what: str) -> Callable[[str, torch.nn.Module], bool] | None:
    if spec is None:
        return None
    if callable(spec):
        return lambda p, m: bool(spec(p, m))
    pats = [spec] if isinstance(spec, str) else spec
    if isinstance(pats, (list, tuple, set, frozenset)) and all(isinstance(s, str) for s in pats):
        pats = list(pats)
        return lambda p, m: any(fnmatch.fnmatchcase(p, pat) for pat in pats)
    raise CaptureError(f"{what} must be a glob pattern, a list of them or a callable(path, module) -> bool, "
                       f"got {spec!r}", key=what, fix=f"e.g. {what}='model.layers.*.linear_attn*'")


def _describe(spec: Filter):
    if spec is None or isinstance(spec, str):
        return spec
    if callable(spec):
        return f"<callable {getattr(spec, '__qualname__', type(spec).__name__)}>"
    return list(spec)


def _leaves(obj: Any, prefix: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif depth >= _MAX_DEPTH:
        return
    elif isinstance(obj, dict):  # includes transformers' ModelOutput
        for k, v in obj.items():
            yield from _leaves(v, f"{prefix}.{k}", depth + 1)
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{prefix}.{i}", depth + 1)


class Recorder:
    """The object :func:`record` yields. Read-only attributes describe the recording so far.

    Attributes
    ----------
    path: the capture directory
    step: the step the next (or current) root forward records under
    stopped: True once the byte cap stopped recording
    hooked: module paths whose tensors are recorded
    """

    def __init__(self, model: torch.nn.Module, writer: CaptureWriter, *, include: Filter, exclude: Filter,
                 max_bytes: int | None, rank: int, mapper, inputs: bool, outputs: bool,
                 on_budget: str, overrides: Mapping[tuple, torch.Tensor] | None = None,
                 dims: Mapping[str, str] | None = None) -> None:
        self.model = model
        self._dims = list((dims or {}).items())  # ("module.path/name" glob, spec), first match wins
        self._paths: dict[tuple[int, str], str] = {}
        self._classes: dict[tuple[int, str], str] = {}
        self.world = _world()  # {"world_rank", "world_size"} when torch.distributed is initialised
        self.writer = writer
        self.path = writer.path
        self.rank = rank
        self.max_bytes = max_bytes
        self.on_budget = on_budget
        self._record_inputs = inputs
        self._record_outputs = outputs
        self._include_spec, self._exclude_spec = include, exclude
        self._include = _matcher(include, "include")
        self._exclude = _matcher(exclude, "exclude")
        self._mapper = mapper
        self.step = 0
        self.stopped = False
        self.stopped_at: dict | None = None
        self._budget_raised = False
        self._depth = 0
        self._calls: dict[tuple[int, str], int] = {}
        self._stacks: dict[int, list[int]] = {}
        self._handles: list = []
        self.hooked: list[str] = []
        self.skipped = {"dtype": 0, "budget": 0}
        self.pending: dict[tuple, torch.Tensor] = dict(overrides or {})
        self.kernels = None  # the KernelLog of the recording (workbench.kernels.registry.kernel_log)
        self.grafted: list[tuple] = []

    # -- public ------------------------------------------------------------------------------
    def add_batch(self, *, requests, positions) -> None:
        """Record which request and position each token row of the current step belongs to
        (:meth:`CaptureWriter.add_batch`): runs that chunk or batch differently then compare row
        by row. Call it once per step, before the model call of that step."""
        self.writer.add_batch(self.step, requests=requests, positions=positions, rank=self.rank)

    @property
    def bytes_written(self) -> int:
        return self.writer.bytes_written

    @property
    def count(self) -> int:
        """Tensors recorded so far."""
        return len(self.writer)

    def __repr__(self) -> str:
        return (f"<Recorder path={str(self.path)!r} step={self.step} tensors={self.count} "
                f"bytes={self.bytes_written} stopped={self.stopped}>")

    # -- wiring --------------------------------------------------------------------------------
    def _key_of(self, path: str, module: torch.nn.Module) -> tuple[int, str]:
        if self._mapper is not None:
            try:
                got = self._mapper(path, module)
            except Exception as e:
                raise CaptureError(f"mapper failed: {type(e).__name__}: {e}", key=path,
                                   fix="make mapper(path, module) return (layer, op) or None") from e
            if got is not None:
                ok = (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], int)
                      and not isinstance(got[0], bool) and got[0] >= -1 and isinstance(got[1], str) and got[1])
                if not ok:
                    raise CaptureError(f"mapper returned {got!r} for module {path!r}", key=path,
                                       fix="return (layer: int >= -1, op: non-empty str), or None for the default")
                return got
        layer, op = split_module_path(path)
        return (-1 if layer is None else layer), (op or "root")

    def _wanted(self, path: str, module: torch.nn.Module) -> bool:
        if self._include is not None and not self._include(path, module):
            return False
        return not (self._exclude is not None and self._exclude(path, module))

    def _attach(self) -> None:
        for path, module in self.model.named_modules():
            is_root = module is self.model
            want = self._wanted(path, module)
            if not (want or is_root):
                continue
            key = self._key_of(path, module) if want else None
            if want:
                self.hooked.append(path)
                self._paths.setdefault(key, path)
                self._classes.setdefault(key, type(module).__name__)
            self._handles.append(module.register_forward_pre_hook(
                self._make_pre(key, is_root), with_kwargs=True, prepend=is_root))
            self._handles.append(module.register_forward_hook(
                self._make_post(key, is_root), always_call=True))

    def _detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        bar = getattr(self, "_bar", None)
        if bar is not None:
            bar.close()
            self._bar = None

    def _make_pre(self, key, is_root: bool):
        def pre(module, args, kwargs):
            if is_root:
                self._depth += 1
            if key is None:
                return None
            idx = self._calls.get(key, 0)
            self._calls[key] = idx + 1
            self._stacks.setdefault(id(module), []).append(idx)
            if self.pending:
                new_args = tuple(self._graft(a, key, "input" if i == 0 and isinstance(a, torch.Tensor)
                                             else f"input.{i}", idx) for i, a in enumerate(args))
                new_kwargs = {k: self._graft(v, key, f"input.{k}", idx) for k, v in kwargs.items()}
                changed = any(x is not y for x, y in zip(new_args, args)) or \
                    any(new_kwargs[k] is not kwargs[k] for k in kwargs)
                args, kwargs = new_args, new_kwargs
            else:
                changed = False
            if self._record_inputs and not self.stopped:
                for i, a in enumerate(args):
                    base = "input" if i == 0 and isinstance(a, torch.Tensor) else f"input.{i}"
                    for name, t in _leaves(a, base):
                        self._add(t, key, name, idx)
                for k, v in kwargs.items():
                    for name, t in _leaves(v, f"input.{k}"):
                        self._add(t, key, name, idx)
            return (args, kwargs) if changed else None
        return pre

    def _make_post(self, key, is_root: bool):
        def post(module, args, output):
            if key is not None:
                stack = self._stacks.get(id(module))
                idx = stack.pop() if stack else 0
                if self.pending and output is not None:
                    grafted = self._graft(output, key, "output", idx)
                    replaced, output = grafted is not output, grafted
                else:
                    replaced = False
                if self._record_outputs and not self.stopped and output is not None:
                    for name, t in _leaves(output, "output"):
                        self._add(t, key, name, idx)
            if is_root:
                self._depth -= 1
                if self._depth == 0:
                    self.step += 1
                    if getattr(self, "_bar", None) is None:
                        from workbench.progress import counter
                        self._bar = counter(desc=f"record {self.writer.arm}", unit="step")
                    self._bar.update(1)
                    self._calls.clear()
                    self._raise_if_over_budget()
            return output if key is not None and replaced else None
        return post

    def _graft(self, obj: Any, key: tuple[int, str], prefix: str, idx: int, depth: int = 0) -> Any:
        """``obj`` with each tensor leaf whose key is in :attr:`pending` replaced by its override
        (the same object when nothing is replaced)."""
        if isinstance(obj, torch.Tensor):
            name = f"{prefix}#{idx}" if idx else prefix
            k = (self.rank, self.step, key[0], key[1], name)
            if k not in self.pending:
                return obj
            v = self.pending.pop(k)
            if tuple(v.shape) != tuple(obj.shape):
                raise GraftError(f"override of {k} has shape {tuple(v.shape)}, the model produces "
                                 f"{tuple(obj.shape)}", key="overrides",
                                 fix="take overrides from a run of the same model on the same input")
            self.grafted.append(k)
            return v.detach().to(device=obj.device, dtype=obj.dtype).clone()
        if depth >= _MAX_DEPTH:
            return obj
        if isinstance(obj, dict):
            new = {kk: self._graft(v, key, f"{prefix}.{kk}", idx, depth + 1) for kk, v in obj.items()}
            if all(new[kk] is obj[kk] for kk in obj):
                return obj
            try:
                out = type(obj)(**new) if type(obj) is not dict else new  # ModelOutput and friends
            except Exception:
                out = dict(new)
            return out
        if isinstance(obj, (tuple, list)):
            new = [self._graft(v, key, f"{prefix}.{i}", idx, depth + 1) for i, v in enumerate(obj)]
            if all(a is b for a, b in zip(new, obj)):
                return obj
            if isinstance(obj, list):
                return new
            return type(obj)(*new) if hasattr(obj, "_fields") else type(obj)(new)
        return obj

    def _add(self, t: torch.Tensor, key: tuple[int, str], name: str, idx: int) -> None:
        if self.stopped:
            return
        if _capturing_cuda_graph():
            raise CaptureError(
                f"record() was called inside CUDA graph capture (module {self._paths.get(key, key[1])!r}): a "
                "captured graph replays without running the hooks, so the capture would hold the warm-up "
                "values only", file=self.path, key=self._paths.get(key, key[1]),
                fix="record eagerly: run the model without CUDA graphs while recording (SGLang "
                    "--disable-cuda-graph, vLLM enforce_eager=True, or outside torch.cuda.graph())")
        if t.dtype not in TORCH_TO_NAME or t.device.type == "meta":
            self.skipped["dtype"] += 1
            return
        layer, op = key
        if idx:
            name = f"{name}#{idx}"
        nbytes = t.numel() * t.element_size()
        if self.max_bytes is not None and self.writer.bytes_written + nbytes > self.max_bytes:
            self.stopped = True
            self.stopped_at = dict(rank=self.rank, step=self.step, layer=layer, op=op, name=name)
            self.skipped["budget"] += 1
            if self.on_budget == "warn":
                warnings.warn(f"recording stopped at the byte cap ({self.max_bytes} bytes) before "
                              f"step={self.step} layer={layer} op={op} name={name}; the capture keeps what was "
                              f"recorded before it", stacklevel=2)
            return
        spec = None
        if self._dims:
            where = f"{self._paths.get(key, op)}/{name.split('#')[0]}"
            spec = next((d for pat, d in self._dims if fnmatch.fnmatchcase(where, pat)), None)
        tags = {"module": self._paths.get(key, op), "module_class": self._classes.get(key, ""), **self.world}
        n = 0
        while True:
            try:
                self.writer.add(t, rank=self.rank, step=self.step, layer=layer, op=op,
                                name=name if n == 0 else f"{name}~{n}", dims=spec, **tags)
                return
            except DuplicateKeyError:  # only a mapper sending two modules to one (layer, op) gets here
                n += 1

    def _budget_error(self) -> CaptureBudgetError:
        return CaptureBudgetError(
            f"recording stopped at the byte cap: {self.writer.bytes_written} bytes recorded, max_bytes="
            f"{self.max_bytes}; the capture holds everything before the key below", file=self.path,
            key=self.stopped_at,
            fix="raise max_bytes, or record less with include=/exclude= (e.g. exclude='*.mlp.experts*'); "
                "pass on_budget='warn' to keep running without raising")

    def _raise_if_over_budget(self) -> None:
        if self.stopped and self.on_budget == "raise" and not self._budget_raised:
            self._budget_raised = True
            raise self._budget_error()

    def _metadata(self) -> dict:
        m = self.model
        return {
            "model_class": f"{type(m).__module__}.{type(m).__qualname__}",
            "modules": sum(1 for _ in m.named_modules()),
            "hooked": len(self.hooked),
            "torch": torch.__version__,
            "include": _describe(self._include_spec),
            "exclude": _describe(self._exclude_spec),
            "mapper": _describe(self._mapper),
            "inputs": self._record_inputs,
            "outputs": self._record_outputs,
            "max_bytes": self.max_bytes,
            "steps": self.step,
            "truncated": self.stopped,
            "stopped_at": self.stopped_at,
            "skipped": dict(self.skipped),
        }

    def _commit(self) -> None:
        run = dict(self.writer.run)
        run.setdefault("model", type(self.model).__name__)
        run["recorder"] = self._metadata()
        calls = self.kernels.summary() if self.kernels is not None else []
        if calls:
            run["kernels"] = calls  # which workbench backend (and code path) computed what
        self.writer.run = run
        self.writer.close()


@contextlib.contextmanager
def record(model: torch.nn.Module, path: str | os.PathLike, *, arm: str, include: Filter = None,
           exclude: Filter = None, max_bytes: int | None = None, rank: int | None = None, run: dict | None = None,
           mapper: Callable[[str, torch.nn.Module], tuple[int, str] | None] | None = None,
           inputs: bool = True, outputs: bool = True, on_budget: str = "raise",
           shard_bytes: int = DEFAULT_SHARD_BYTES, overwrite: bool = False,
           overrides: Mapping[tuple, torch.Tensor] | None = None,
           dims: Mapping[str, str] | None = None) -> Iterator[Recorder]:
    """Record the inputs and outputs of a model's modules into a capture at ``path``.

    Parameters
    ----------
    model: any torch.nn.Module; one call of it is one step
    path: capture directory to create
    arm: arm name ("control", "candidate", ...)
    include, exclude: which module paths to record: a glob (``fnmatch``, ``*`` also crosses
        dots), a list of globs, or ``fn(path, module) -> bool``; each module is judged on its own
        path (excluding ``model.layers.3`` does not exclude ``model.layers.3.mlp``); the root's
        path is ``""``
    max_bytes: cap on the tensor bytes recorded (see the module docstring)
    rank: rank written into every key (default: torch.distributed's rank when it is initialised,
        else 0); every tensor is tagged with its module path and class (``module``,
        ``module_class``) and, under torch.distributed, ``world_rank``/``world_size``
    run: extra run metadata; the recorder adds ``run["recorder"]`` (model class, module count,
        torch version, filters, steps, truncation)
    mapper: ``mapper(path, module) -> (layer, op)`` or None for the default mapping
    inputs, outputs: record call arguments / results
    on_budget: "raise" (default) or "warn" when the byte cap is reached
    shard_bytes, overwrite: passed to CaptureWriter
    overrides: ``{(rank, step, layer, op, name): tensor}``: a graft. When the hooked module of
        that key is called, the named input (forward pre-hook) or output (forward hook) is
        replaced by the given tensor, which the model then goes on with and which is what is
        recorded; an override whose key is never produced, or of another shape, is a GraftError
        (:class:`ModelRerun` wraps this as the ``rerun(overrides) -> Capture`` protocol)
    dims: ``{"module.path/name" glob: dims spec}``, first match wins, e.g.
        ``{"*.mlp.down_proj/output": "b t h[tp:partial]", "*.mlp.up_proj/output": "b t i[tp]"}``:
        the layout of the recorded tensors (:mod:`workbench.capture.dims`), for logical comparison
        of runs with other parallel layouts; a spec that does not fit its tensor is a DimsError.
        Where the specs name one parallel axis, the ranks are taken in order along it (no
        ``tp_rank`` tags needed)

    Yields
    ------
    Recorder

    Example
    -------
    >>> with record(model, "cap/control", arm="control", exclude="*.act_fn") as rec:   # doctest: +SKIP
    ...     model.generate(ids, max_new_tokens=2)
    >>> open_capture("cap/control").select(layer=3, step=1).index                     # doctest: +SKIP
    """
    if not isinstance(model, torch.nn.Module):
        raise CaptureError(f"record() needs a torch.nn.Module, got {type(model).__name__}", key="model",
                           fix="pass the model (or the submodule) to record")
    if on_budget not in ON_BUDGET:
        raise CaptureError(f"on_budget must be one of {list(ON_BUDGET)}, got {on_budget!r}", key="on_budget",
                           fix="pass on_budget='raise' or 'warn'")
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0):
        raise CaptureError(f"max_bytes must be a non-negative int or None, got {max_bytes!r}", key="max_bytes",
                           fix="e.g. max_bytes=2 << 30 for 2 GiB")
    if mapper is not None and not callable(mapper):
        raise CaptureError(f"mapper must be callable, got {type(mapper).__name__}", key="mapper",
                           fix="pass mapper=lambda path, module: (layer, op)")
    world = _world()
    if rank is None:
        rank = world.get("world_rank", 0)
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise CaptureError(f"rank must be an int >= 0 or None, got {rank!r}", key="rank",
                           fix="pass rank=torch.distributed.get_rank(), or leave it to the recorder")
    writer = CaptureWriter(path, arm=arm, run=run, shard_bytes=shard_bytes, overwrite=overwrite)
    if world:
        writer.run = {**writer.run, "parallel": {**(writer.run.get("parallel") or {}), "world_size": world["world_size"]}}
    if overrides:
        writer.run = {**writer.run, "graft": [list(k) for k in overrides]}
    if dims is not None and not (isinstance(dims, Mapping) and all(isinstance(k, str) and isinstance(v, str)
                                                                   for k, v in dims.items())):
        raise CaptureError("dims must map 'module.path/name' globs to dims specs", key="dims",
                           fix="pass dims={'*.mlp.down_proj/output': 'b t h[tp:partial]'}")
    rec = Recorder(model, writer, include=include, exclude=exclude, max_bytes=max_bytes, rank=rank,
                   mapper=mapper, inputs=inputs, outputs=outputs, on_budget=on_budget, overrides=overrides,
                   dims=dims)
    from workbench.kernels.registry import kernel_log
    try:
        rec._attach()
        with kernel_log() as rec.kernels:  # workbench kernel calls made while recording
            yield rec
    except CaptureBudgetError:
        rec._detach()
        rec._commit()  # what was recorded up to the cap is a valid capture
        raise
    except BaseException:
        rec._detach()
        writer.abort()
        raise
    else:
        rec._detach()
        if rec.pending:
            writer.abort()
            raise GraftError(f"the run never produced {sorted(rec.pending)} (grafted: {rec.grafted})",
                             key="overrides", fix="check the keys against the control capture's index "
                                                  "(the name, and the step the model reaches)")
        rec._commit()
        rec._raise_if_over_budget()  # the cap was hit outside any root forward
    finally:
        rec._detach()


class Rerun(Protocol):
    """The re-run protocol of grafts (:func:`workbench.analysis.divergence.graft`): run the
    candidate arm again, replacing each tensor whose key ``(rank, step, layer, op, name)`` is in
    ``overrides`` by the given value at the moment it is produced, and return the capture of that
    run (``rerun({})``: no graft)."""

    def __call__(self, overrides: Mapping[tuple, torch.Tensor]): ...


class ModelRerun:
    """``rerun(overrides) -> Capture`` for any torch model: ``run(model)`` under :func:`record`
    with ``overrides`` grafted in by forward hooks, each run into a fresh capture.

    Parameters
    ----------
    model: the torch module (as for :func:`record`)
    run: ``run(model)`` drives it (e.g. ``lambda m: m.generate(ids, max_new_tokens=2)``); it must
        do the same thing each call
    arm: the arm name of the captures; workdir: where they go (default a temporary directory that
        lives as long as the returned captures)
    record_options: passed to :func:`record` (include=, exclude=, mapper=, rank=, ...)

    Example
    -------
    >>> rerun = ModelRerun(model, lambda m: m(ids), arm="candidate", include="model.layers.*")   # doctest: +SKIP
    >>> ds = graft(rerun, control_capture, replace="input")                                     # doctest: +SKIP
    """

    def __init__(self, model: torch.nn.Module, run: Callable[[torch.nn.Module], Any], *, arm: str = "rerun",
                 workdir: str | os.PathLike | None = None, **record_options: Any) -> None:
        import tempfile
        bad = sorted(set(record_options) & {"path", "overrides", "overwrite"})
        if bad:
            raise CaptureError(f"ModelRerun sets {bad} itself", key=bad[0], fix=f"drop {bad[0]}=")
        if not callable(run):
            raise CaptureError(f"run must be callable(model), got {type(run).__name__}", key="run",
                               fix="pass run=lambda m: m(input_ids)")
        self.model, self.run, self.arm, self.options = model, run, arm, record_options
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="workbench-graft-")
        self.workdir = Path(workdir) if workdir is not None else Path(self._tmp.name)
        self.runs = 0

    def __call__(self, overrides: Mapping[tuple, torch.Tensor]):
        from workbench.capture.reader import open_capture
        for k in overrides:
            if not (isinstance(k, tuple) and len(k) == 5):
                raise GraftError(f"an override key is (rank, step, layer, op, name), got {k!r}", key="overrides",
                                 fix="take keys from the control capture's index")
        self.runs += 1
        path = self.workdir / f"run-{self.runs}"
        with torch.no_grad(), record(self.model, path, arm=self.arm, overrides=overrides, overwrite=True,
                                     **self.options):
            self.run(self.model)
        cap = open_capture(path)
        cap._workdir = self._tmp  # the temporary directory lives as long as a capture in it
        return cap
