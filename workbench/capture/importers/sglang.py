"""Import a folder written by SGLang's dumper (``sglang.srt.debug_utils.dumper``), or by its
forward-hook dumper (``--debug-tensor-dump-output-folder``: ``TP{t}_PP{p}_Rank{r}_pid{n}/Pass{k}.pt``,
a dict of module outputs per forward pass; see :meth:`SGLangImporter._run_hooks` and
docs/capturing.md).

File names
----------
One ``.pt`` per dumped tensor, named by its fields joined with ``___``::

    step=3___rank=1___dump_index=42___name=layer_start__hidden_states___layer_id=7.pt   (current)
    forward_pass_id=3___name=attn_out___layer_id=7.pt                                    (older)

Older dumps keep each rank in its own folder ``sglang_dump_<time>_<rank>/`` and hold a bare
tensor; current ones hold ``{"value": tensor, "meta": {...}}``. Files may sit in any subfolder.
Keys are identifiers starting with a letter, without ``___``; a value runs up to the next
``___key=`` (so values may hold dots, ``=`` and underscores, but not ``___`` followed by ``key=``).

Mapping to capture keys
-----------------------
* step: ``step``, else ``forward_pass_id``, else 0; rank: ``rank``, else the ``_<rank>`` suffix of
  an ``sglang_dump_*`` folder, else 0; layer: ``layer_id``, else a ``layers.<i>`` component of a
  dotted name, else -1.
* op and name from the dumped name (``non_intrusive__`` prefixes dropped, ``__`` separates
  qualifiers from the last part):

  ========================================  ======  ======================  =================
  dumped name                               layer   op                      name
  ========================================  ======  ======================  =================
  ``model.layers.3.self_attn.o_proj.output``  3     ``self_attn.o_proj``    ``output``
  ``non_intrusive__model.layers.3.mlp.inputs.0`` 3  ``mlp``                 ``inputs.0``
  ``grad__model.layers.3.mlp.output``         3     ``mlp``                 ``grad.output``
  ``grad__mlp_output`` (no ``layer_id``)      see below ``mlp_output``        ``grad.value``
  ``lm_head.output``                          -1    ``lm_head``             ``output``
  ``layer_start__hidden_states``              id    ``layer_start``         ``hidden_states``
  ``logits``                                  id    ``logits``              ``value``
  ========================================  ======  ======================  =================

  ``mapper(dumped_name, fields) -> (layer, op, name)`` replaces this rule. ``grad__``/``param__``
  (a gradient, a parameter) keep the key of the tensor they belong to, the kind in front of the
  name. The dumper's gradient hooks drop the ``layer_id`` that ``dumper.set_ctx`` gave the forward
  dump; a gradient file without one takes the layer of its tensor's forward dumps in reverse
  (backward) order, tagged ``layer_from``.
* seq (causal order): sorted by step, then ``dump_index`` (the dumper's own counter; files without
  one by modification time), then rank, then path.
* tags: every other field of the name (``dump_index``, ``recompute_status``, ``tp_rank``...), the
  scalar entries of ``meta``, and ``dump_name`` (the original name). ``meta["dims"]`` (the
  dumper's ``dims=`` annotation) is checked against the tensor (a spec that does not parse or fit
  refuses the file); the scalars of ``meta["sglang_parallel_info"]`` (``tp_rank``, ``tp_size``...)
  become tags, the rank's coordinates for logical comparison, and the first file's sizes are kept
  in ``run["parallel"]``.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

from workbench.capture.importers._files import (
    Skips, check_src, check_tensor, load_pt, natural_key, safe_tags, scalar_tags, walk,
)
from workbench.capture.importers.base import Importer
from workbench.capture.recorder import split_module_path
from workbench.capture.writer import CaptureWriter
from workbench.errors import DimsError, DuplicateKeyError, FileNameError, ImporterError, UnsafeFileError

__all__ = ["SGLangImporter", "parse_dump_name", "format_dump_name", "split_dump_name"]

SEPARATOR = "___"
# keys are identifiers that start with a letter and hold no "___"
_KEY = re.compile(r"[A-Za-z](?:(?!___)[A-Za-z0-9_])*")
# a separator is only a separator when a key and "=" follow it; the last of several underscores wins
_SPLIT = re.compile(r"___(?=[A-Za-z](?:(?!___)[A-Za-z0-9_])*=)")
_INT = re.compile(r"-?\d+")
_RANK_DIR = re.compile(r"sglang_dump_.*_(\d+)")
_IO = re.compile(r"^(?:(?P<mod>.*?)\.)?(?P<io>(?:inputs?|outputs?)(?:\..*)?)$")
_INT_FIELDS = ("step", "forward_pass_id", "rank", "dump_index", "layer_id")
# SGLang core fields that say where a request sits in the engine's pools, not what it computes:
# kept in run["values"], not compared
BOOKKEEPING = ("req_pool_indices",)
# kinds the dumper prefixes to a name (``grad__x``: the gradient of x; ``param__x``: a parameter):
# the same (layer, op) as x, the kind in front of the name, so they never mix with the values
KINDS = ("grad", "param")
_HOOK_DIR = re.compile(r"TP(\d+)_PP(\d+)_Rank(\d+)_pid(\d+)")
_HOOK_FILE = re.compile(r"Pass(\d+)\.pt")


class _Value:
    """A dumped value that is not a tensor (SGLang's ``rids``: a list of strings)."""

    def __init__(self, value) -> None:
        self.value = value


def _plain(v, depth: int = 0) -> bool:
    """JSON-like data without tensors: scalars, strings, and lists/tuples/dicts of them."""
    if isinstance(v, (str, int, float, bool)) or v is None:
        return True
    if depth < 4 and isinstance(v, (list, tuple)):
        return all(_plain(x, depth + 1) for x in v)
    if depth < 4 and isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x, depth + 1) for k, x in v.items())
    return False


def _jsonable(v, limit: int = 4096):
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return repr(v)  # manifests are strict JSON
    if isinstance(v, (list, tuple)):
        return [_jsonable(x, limit) for x in list(v)[:limit]]
    if isinstance(v, dict):
        return {k: _jsonable(x, limit) for k, x in list(v.items())[:limit]}
    if isinstance(v, str):
        return v.encode("utf-8", "backslashreplace").decode("utf-8")
    return v


def batch_rows_from_core(rids, positions, seq_lens) -> list[tuple[str, int]] | None:
    """Each token row's (request id, position) from SGLang's core fields of a forward pass: the
    rows run request by request in ``rids`` order, request i's last row at position
    ``seq_lens[i] - 1``. None when they do not add up (the pass cannot be aligned)."""
    rids = [str(r) for r in rids]
    if len(rids) != len(seq_lens) or not positions:
        return None
    out, i = [], 0
    for rid, n in zip(rids, seq_lens):
        start = i
        while i < len(positions) and positions[i] != n - 1:
            i += 1
        if i >= len(positions) or any(positions[j + 1] != positions[j] + 1 for j in range(start, i)):
            return None
        out += [(rid, int(p)) for p in positions[start:i + 1]]
        i += 1
    return out if i == len(positions) else None


def _hook_file(rel: str) -> bool:
    """A pass file of SGLang's forward-hook dumper (``--debug-tensor-dump-output-folder``)."""
    p = Path(rel)
    return bool(_HOOK_FILE.fullmatch(p.name) and _HOOK_DIR.fullmatch(p.parent.name))
ORDERS = ("auto", "mtime", "path")
DUPLICATES = ("raise", "suffix")
# nested parallel info in a dump's meta: its scalars become the tensor's tags (coordinates for
# logical comparison), the sizes of the first file go to run["parallel"]
PARALLEL_INFO_KEYS = ("sglang_parallel_info", "megatron_parallel_info")


def parse_dump_name(filename: str) -> dict[str, str]:
    """Fields of an SGLang dump file name, in order (values are strings).

    Raises FileNameError naming the file and the expected form.
    """
    fix = "SGLang dump files are named key=value___key=value....pt with a name= field"
    if not filename.endswith(".pt"):
        raise FileNameError("not a .pt file", file=filename, fix=fix)
    stem = filename[:-3]
    fields: dict[str, str] = {}
    for part in _SPLIT.split(stem):
        key, sep, value = part.partition("=")
        if not sep or not _KEY.fullmatch(key):
            raise FileNameError(f"cannot parse {part!r} as key=value", file=filename, fix=fix)
        if key in fields:
            raise FileNameError(f"field {key!r} appears twice", file=filename, fix=fix)
        fields[key] = value
    if not fields.get("name"):
        raise FileNameError("the file name has no (or an empty) name= field", file=filename, fix=fix)
    for k in _INT_FIELDS:
        v = fields.get(k)
        if v is not None and v != "None" and not _INT.fullmatch(v):
            raise FileNameError(f"field {k}={v!r} is not an integer", file=filename, key=k, fix=fix)
    return fields


def format_dump_name(fields: dict[str, Any]) -> str:
    """The file name SGLang's dumper gives these fields (inverse of :func:`parse_dump_name`)."""
    return SEPARATOR.join(f"{k}={v}" for k, v in fields.items()) + ".pt"


def split_dump_name(dumped: str, layer_id: int | None = None) -> tuple[int, str, str]:
    """(layer, op, name) of a dumped tensor name; see the module docstring for the rule."""
    segs = [s for s in dumped.split("__") if s and s != "non_intrusive"]
    if len(segs) > 1 and segs[0] in KINDS:  # a gradient or parameter: the tensor's key, its kind in the name
        layer, op, name = split_dump_name("__".join(segs[1:]), layer_id)
        return layer, op, f"{segs[0]}.{name}"
    if not segs:
        return (-1 if layer_id is None else layer_id), dumped, "value"
    last, quals = segs[-1], segs[:-1]
    if "." in last:
        m = _IO.match(last)
        if m:
            mod, io = m.group("mod") or "", m.group("io")
        else:
            mod, _, io = last.rpartition(".")
        layer, op = split_module_path(mod)
        if layer is None:
            layer = -1 if layer_id is None else layer_id
        return layer, op or "root", ".".join([*quals, io])
    layer = -1 if layer_id is None else layer_id
    if quals:
        return layer, "__".join(quals), last
    return layer, last, "value"


def _int(v: str | None) -> int | None:
    return None if v is None or v == "None" else int(v)


def _tag_value(v: str):
    return int(v) if _INT.fullmatch(v) and len(v) < 19 else v


class SGLangImporter(Importer):
    name = "sglang"
    description = "SGLang dumper folders: one key=value___key=value.pt per tensor"

    def run(self, src: str | os.PathLike, dst: str | os.PathLike, *, arm: str | None = None,
            run: dict | None = None, on_error: str = "raise", order: str = "auto",
            duplicates: str = "raise", rank: int = 0,
            mapper: Callable[[str, dict], tuple[int, str, str]] | None = None,
            top_module: str = "model", overwrite: bool = False) -> Path:
        """Import ``src`` (an SGLang dump folder) into a new capture at ``dst``.

        Parameters
        ----------
        arm: arm name (default: the folder's name)
        run: extra run metadata; the importer adds ``run["importer"]`` (source, counts, skips)
        on_error: "raise" (default) or "skip": skip unparsable names and unreadable or unsafe
            files, listing them under ``run["importer"]["skipped"]``
        order: "auto" (step, dump_index or mtime, rank, path), "mtime" or "path"
        duplicates: "raise" (default) or "suffix": later tensors with an already used key get
            ``#1``, ``#2``... appended to their name, in causal order
        rank: rank of files whose name and folder do not give one
        mapper: ``mapper(dumped_name, fields) -> (layer, op, name)`` replacing the default rule
        top_module: forward-hook dumps: the model's top-level module (SGLang's
            ``TENSOR_DUMP_TOP_LEVEL_MODULE_NAME``, default ``model``)
        overwrite: replace an existing capture at ``dst``
        """
        root = check_src(src)
        skips = Skips(on_error, root)
        if order not in ORDERS:
            raise ImporterError(f"order must be one of {list(ORDERS)}, got {order!r}", key="order",
                                fix="pass order='auto', 'mtime' or 'path'")
        if duplicates not in DUPLICATES:
            raise ImporterError(f"duplicates must be one of {list(DUPLICATES)}, got {duplicates!r}",
                                key="duplicates", fix="pass duplicates='raise' or 'suffix'")
        files = walk(root, (".pt",), skips)
        if not files and not skips.items:
            raise ImporterError("no .pt files found", file=root,
                                fix="point SRC at the dumper's output folder (DUMPER_DIR/<exp_name>)")
        hooks = [(p, rel) for p, rel in files if _hook_file(rel)]
        if hooks:  # --debug-tensor-dump-output-folder: TP{t}_PP{p}_Rank{r}_pid{n}/Pass{k}.pt
            others = [rel for p, rel in files if not _hook_file(rel)]
            if others:
                raise ImporterError(f"the folder mixes forward-hook pass files and {len(others)} other .pt files "
                                    f"(e.g. {others[0]})", file=root,
                                    fix="import the TP*_PP*_Rank*_pid* folders and the dumper's files separately")
            return self._run_hooks(root, hooks, dst, arm=arm, run=run, skips=skips, top_module=top_module,
                                   overwrite=overwrite, on_error=on_error)
        entries = []
        for path, rel in files:
            try:
                entries.append(self._entry(path, rel, rank, mapper))
            except FileNameError as e:
                skips(e)
        entries.sort(key=lambda e: self._order_key(e, order))
        if mapper is None:
            self._grad_layers(entries)
        self._resolve_duplicates(entries, duplicates, root)

        meta = dict(run or {})
        info = {"kind": self.name, "source": str(root.resolve()), "files": len(files),
                "options": {"on_error": on_error, "order": order, "duplicates": duplicates}}
        imported = 0
        parallel: dict = {}
        values: list[dict] = []
        core: dict = {}  # (rank, step, "positions" | "seq_lens") -> tensor, for the batch rows
        from workbench.progress import progress

        with CaptureWriter(dst, arm=arm or root.resolve().name, run=meta, overwrite=overwrite) as w:
            for e in progress(entries, desc=f"import sglang {root.name}", unit="file", min_total=50):
                try:
                    tensor, extra = self._load(e["path"])
                except (UnsafeFileError, ImporterError) as err:
                    skips(err)
                    continue
                if e["fields"]["name"] in BOOKKEEPING and not isinstance(tensor, _Value):
                    tensor = _Value(tensor.reshape(-1).tolist())  # allocator slots: they differ with batching
                if isinstance(tensor, _Value):  # not a tensor: run metadata (rids feed token alignment)
                    values.append({"step": e["step"], "rank": e["rank"], "layer": e["layer"], "name": e["fields"]["name"],
                                   "value": _jsonable(tensor.value)})
                    continue
                tags = safe_tags({**scalar_tags(extra, set(e["tags"]) | set(e["fields"])), **e["tags"]})
                for key in PARALLEL_INFO_KEYS:  # the rank's coordinates (tp_rank, tp_size, ...) as tags
                    pinfo = extra.get(key)
                    if isinstance(pinfo, dict) and not any(str(k).endswith("_error") for k in pinfo):
                        tags.update(scalar_tags({k: v for k, v in pinfo.items() if k not in tags}))
                        parallel.setdefault(key, {k: v for k, v in pinfo.items() if not str(k).endswith("_rank")})
                try:
                    w.add(tensor, rank=e["rank"], step=e["step"], layer=e["layer"], op=e["op"],
                          name=e["name"], **tags)
                except DimsError as err:  # a dims spec that does not parse or fit: the file is refused
                    skips(DimsError(err.message, file=e["path"], key=err.key, fix=err.fix))
                    continue
                imported += 1
                if e["fields"]["name"] in ("positions", "seq_lens"):
                    core[(e["rank"], e["step"], e["fields"]["name"])] = tensor
            aligned = self._core_batch_rows(w, values, core)
            info.update(imported=imported, skipped=skips.summary(), values=len(values), batch_rows=aligned)
            meta["importer"] = info
            if values:
                meta["values"] = values[:2000]
            if w.run.get("requests"):
                meta["requests"] = w.run["requests"]
            if parallel:
                meta.setdefault("parallel", parallel)
            w.run = meta
        return Path(dst)

    @staticmethod
    def _core_batch_rows(w: CaptureWriter, values: list[dict], core: dict) -> list[int]:
        """Batch rows (request, position) of every step whose ``rids`` were dumped with its
        ``positions`` and ``seq_lens`` (SGLang's core fields); returns the steps aligned."""
        done = []
        for v in values:
            if v["name"] != "rids" or not isinstance(v["value"], list):
                continue
            have = {n: core.get((v["rank"], v["step"], n)) for n in ("positions", "seq_lens")}
            if any(t is None for t in have.values()):
                continue
            rows = batch_rows_from_core(v["value"], have["positions"].reshape(-1).tolist(),
                                        have["seq_lens"].reshape(-1).tolist())
            if rows is None:
                continue
            w.add_batch(v["step"], requests=[r for r, _ in rows], positions=[p for _, p in rows], rank=v["rank"])
            done.append(v["step"])
        return done

    # -- forward-hook dumps ----------------------------------------------------------------------
    def _run_hooks(self, root: Path, files, dst, *, arm, run, skips: Skips, top_module: str, overwrite: bool,
                   on_error: str) -> Path:
        """``--debug-tensor-dump-output-folder``: one ``Pass<k>.pt`` per forward pass and rank, a dict
        of module outputs. The root module's output and what runs after it (lm_head, logits) are
        written into the next pass's file: they are put back on their own pass."""
        top = str(top_module or "model")
        items, ranks, per_pass_batch = [], {}, {}
        for path, rel in sorted(files, key=lambda f: natural_key(f[1])):
            m = _HOOK_DIR.fullmatch(Path(rel).parent.name)
            k = int(_HOOK_FILE.fullmatch(Path(rel).name).group(1))
            tp, pp, rank, pid = (int(x) for x in m.groups())
            ranks[rank] = (tp, pp)
            try:
                obj = load_pt(path)
                if not isinstance(obj, dict):
                    raise UnsafeFileError(f"a forward-hook pass file holds a {type(obj).__name__}, not a dict of "
                                          "module outputs", file=path, fix="skip the file with on_error='skip'")
                entries = []
                for i, (key, v) in enumerate(obj.items()):
                    tensors = v if isinstance(v, (list, tuple)) else [v]
                    for j, t in enumerate(tensors):
                        check_tensor(t, path, f"entry {key!r}")
                    entries.append((i, str(key), tensors, isinstance(v, (list, tuple))))
            except (UnsafeFileError, ImporterError) as err:
                skips(err)
                continue
            for i, key, tensors, many in entries:
                own = key.startswith(top + ".") and key != top
                step = k if own or k == 0 else k - 1  # the root's output and later modules: the previous pass
                if key.startswith(top + ".forward_batch_info."):
                    layer, op, name = -1, "forward_batch_info", key.rsplit(".", 1)[1]
                elif key.startswith(top + ".pp_proxy_tensors."):
                    layer, op, name = -1, "pp_proxy_tensors", key[len(top + ".pp_proxy_tensors."):]
                else:
                    lay, op = split_module_path(key)
                    layer, name = (-1 if lay is None else lay), "output"
                for j, t in enumerate(tensors):
                    items.append(dict(order=(step, rank, 0 if own else 1, i, j), step=step, rank=rank, layer=layer,
                                      op=op, name=f"{name}.{j}" if many else name, tensor=t,
                                      tags={"tp_rank": tp, "pp_rank": pp, "pid": pid, "pass_file": k,
                                            "module": key}))
                if op == "forward_batch_info":
                    per_pass_batch.setdefault((rank, step), {})[name] = tensors[0]
        items.sort(key=lambda d: d["order"])
        meta = dict(run or {})
        sizes = {"tp_size": len({t for t, _ in ranks.values()}), "pp_size": len({p for _, p in ranks.values()})}
        info = {"kind": self.name, "layout": "forward hooks", "source": str(root.resolve()), "files": len(files),
                "options": {"on_error": on_error, "top_module": top}}
        with CaptureWriter(dst, arm=arm or root.resolve().name, run=meta, overwrite=overwrite) as w:
            for d in items:
                w.add(d["tensor"], rank=d["rank"], step=d["step"], layer=d["layer"], op=d["op"], name=d["name"],
                      **safe_tags({**d["tags"], "tp_size": sizes["tp_size"], "pp_size": sizes["pp_size"]}))
            # one request per pass (seq_lens of length 1): its rows are positions of one request, so runs
            # that chunk its prefill differently align by position
            single = per_pass_batch and all(len(b.get("seq_lens", ())) == 1 and "positions" in b
                                            for b in per_pass_batch.values())
            if single:  # the dump names no request: the one request of every pass is "request-0"
                for (rank, step), b in sorted(per_pass_batch.items()):
                    pos = b["positions"].reshape(-1).tolist()
                    w.add_batch(step, requests=["request-0"] * len(pos), positions=pos, rank=rank)
            info.update(imported=len(items), skipped=skips.summary(), batch_rows=bool(single))
            meta["importer"] = info
            meta.setdefault("parallel", sizes)
            if w.run.get("requests"):
                meta["requests"] = w.run["requests"]
            w.run = meta
        return Path(dst)

    # -- helpers -------------------------------------------------------------------------------
    @staticmethod
    def _entry(path: Path, rel: str, default_rank: int, mapper) -> dict:
        fields = parse_dump_name(path.name)
        step = _int(fields.get("step"))
        if step is None:
            step = _int(fields.get("forward_pass_id"))
        rank = _int(fields.get("rank"))
        if rank is None:
            for part in reversed(Path(rel).parts[:-1]):
                if m := _RANK_DIR.fullmatch(part):
                    rank = int(m.group(1))
                    break
        layer_id = _int(fields.get("layer_id"))
        dumped = fields["name"]
        if mapper is not None:
            try:
                layer, op, name = mapper(dumped, dict(fields))
            except Exception as err:
                raise ImporterError(f"mapper failed on {dumped!r}: {type(err).__name__}: {err}", file=path,
                                    fix="make mapper(dumped_name, fields) return (layer, op, name)") from err
        else:
            layer, op, name = split_dump_name(dumped, layer_id)
        for what, v in (("step", step), ("rank", rank)):
            if v is not None and v < 0:
                raise FileNameError(f"{what} is negative ({v})", file=path, key=what,
                                    fix="SGLang steps and ranks are >= 0; rename the file")
        consumed = {"step", "forward_pass_id", "rank", "name", "layer_id"}
        tags = {k: _tag_value(v) for k, v in fields.items() if k not in consumed}
        tags["dump_name"] = dumped
        if "forward_pass_id" in fields and "step" in fields:
            tags["forward_pass_id"] = _tag_value(fields["forward_pass_id"])
        di = _int(fields.get("dump_index"))
        return dict(path=path, rel=rel, fields=fields, step=step or 0,
                    rank=default_rank if rank is None else rank, layer=layer, op=op, name=name,
                    dump_index=di, tags=tags)

    @staticmethod
    def _order_key(e: dict, order: str) -> tuple:
        if order == "path":
            return (e["step"], e["rank"], natural_key(e["rel"]))
        mtime = e["path"].stat().st_mtime_ns
        if order == "mtime" or e["dump_index"] is None:
            return (e["step"], 1, mtime, e["rank"], natural_key(e["rel"]))
        return (e["step"], 0, e["dump_index"], e["rank"], natural_key(e["rel"]))

    @staticmethod
    def _grad_layers(entries: list[dict]) -> None:
        """Give ``grad__x`` files without a layer the layers of x's forward dumps.

        The dumper's gradient hooks keep the arguments of the ``dump()`` call but not the context
        (``dumper.set_ctx(layer_id=...)``, as SGLang's layers set it), so their files carry no
        ``layer_id``. The backward reaches the tensors in the reverse order of the forward: the
        i-th gradient of x written (by ``dump_index``) in a step and rank is that of the i-th last
        forward dump of x. Recovered only when every such gradient has a forward dump with a layer
        and dump indices order both; tagged ``layer_from`` to say so.
        """
        grads: dict[tuple, list[dict]] = defaultdict(list)
        fwd: dict[tuple, list[dict]] = defaultdict(list)
        for e in entries:
            dumped = e["fields"]["name"]
            if e["dump_index"] is None:
                continue
            if dumped.startswith("grad__") and e["layer"] == -1 and "layer_id" not in e["fields"]:
                grads[(e["rank"], e["step"], dumped[len("grad__"):])].append(e)
            elif e["layer"] != -1:
                fwd[(e["rank"], e["step"], dumped)].append(e)
        for key, gs in grads.items():
            fs = sorted(fwd.get(key, []), key=lambda e: e["dump_index"])
            gs = sorted(gs, key=lambda e: e["dump_index"])
            if not fs or len(gs) > len(fs) or gs[0]["dump_index"] < fs[-1]["dump_index"]:
                continue  # no forward dumps with layers, or not a backward after them: left as dumped
            for i, g in enumerate(gs):
                g["layer"] = fs[len(fs) - 1 - i]["layer"]
                g["tags"]["layer_from"] = f"backward order of {key[2]}'s forward dumps"

    @staticmethod
    def _resolve_duplicates(entries: list[dict], duplicates: str, root: Path) -> None:
        seen: dict[tuple, list[dict]] = defaultdict(list)
        for e in entries:
            seen[(e["rank"], e["step"], e["layer"], e["op"], e["name"])].append(e)
        for key, group in seen.items():
            if len(group) < 2:
                continue
            if duplicates == "raise":
                files = ", ".join(g["rel"] for g in group[:4])
                raise DuplicateKeyError(
                    f"{len(group)} dump files map to the same capture key ({files})", file=root,
                    key=dict(zip(("rank", "step", "layer", "op", "name"), key)),
                    fix="pass duplicates='suffix' (names become name#1, name#2 in dump order), or a "
                        "mapper that puts dump_index into the name; or point SRC at a single "
                        "experiment folder")
            used = set(seen)
            for i, g in enumerate(group[1:], start=1):
                n = i
                while (*key[:4], f"{key[4]}#{n}") in used:
                    n += 1
                g["name"] = f"{key[4]}#{n}"
                used.add((*key[:4], g["name"]))

    @staticmethod
    def _load(path: Path):
        obj = load_pt(path)
        if isinstance(obj, dict):
            extra = set(obj) - {"value", "meta"}
            if "value" not in obj or extra:
                raise UnsafeFileError(
                    f"the file holds a dict with keys {sorted(map(str, obj))[:8]}, expected "
                    f"{{'value': tensor, 'meta': dict}}", file=path,
                    fix="import such files with the 'folder' importer, or skip them with on_error='skip'")
            meta = obj.get("meta", {})
            if not isinstance(meta, dict):
                raise UnsafeFileError(f"'meta' is a {type(meta).__name__}, not a dict", file=path,
                                      fix="skip the file with on_error='skip'")
            value = obj["value"]
            if _plain(value):  # rids (a list of request-id strings), a scalar: kept as run metadata
                return _Value(value), meta
            return check_tensor(value, path, "'value'"), meta
        return check_tensor(obj, path, "the file's content"), {}
