"""Import FlashInfer's API-logging dumps (``FLASHINFER_LOGLEVEL=10``, ``flashinfer/api_logging.py``).

Layout
------
``FLASHINFER_DUMP_DIR`` holds one folder per call of a ``@flashinfer_api`` function,
``<YYYYmmdd_HHMMSS_mmm>_pid<pid>_<function>_call<NNNN>/``, with ``inputs.pt`` / ``outputs.pt``
(``torch.save`` of a dict of tensors; read with ``weights_only=True``, never unpickled) or
``inputs.safetensors`` / ``outputs.safetensors`` (``FLASHINFER_DUMP_SAFETENSORS=1``), and
``metadata.jsonl`` (one record when the inputs are saved, another when the call completes:
function name, per-function call sequence, timestamp, process id, the non-tensor arguments, the
signature, the status). ``session.jsonl`` at the top lists every record in the order written.
Calls captured in a CUDA graph are written at each replay's flush under
``graph_flushes/flush_<NNNN>/``; each flush is one replay of the call.

Mapping to capture keys
-----------------------
* rank: one per process id, in the order the processes first call (tags ``pid``);
* causal order (seq): the order of ``session.jsonl``, else (timestamp, process, call sequence);
* op: the function name (``rmsnorm``, ``BatchDecodeWithPagedKVCacheWrapper.run``);
* name: ``input.<argument>`` from the signature (``arg_1`` of ``run(self, q, ...)`` is
  ``input.q``; a tuple argument's items are ``input.paged_kv_cache.0``...; ``kwarg_x`` is
  ``input.x``), ``output`` or ``output.<i>`` for a tuple result;
* step and layer (``step_from``, ``layers``): FlashInfer records calls, not steps. A *step marker*
  function (``step_from``, default ``auto``: a ``*.plan`` method if the dump has one, as the
  batch wrappers plan once per forward pass) starts a new step in its process; within a step the
  k-th call of a function is layer k (a function called once per step gets layer -1). With no
  marker, ``layers=L`` numbers each function's calls as step ``k // L``, layer ``k % L``; without
  either, each call of a function is a step of its own, layer -1. A graph replay's flush k is
  step ``E + k - 1`` after the process's E eager steps (its layer that of the captured call).
* tags: ``pid``, ``call_sequence``, ``timestamp``, ``status`` (the last record's execution status)
  and the call's scalar arguments (``arg.eps``...).

A folder without ``metadata.jsonl``, unreadable files, a record that is not JSON or lacks the
function name: an ImporterError naming the file (``on_error="skip"`` lists them in
``run["importer"]["skipped"]`` instead).
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from collections import defaultdict
from pathlib import Path

import torch

from workbench.capture.importers._files import (
    Skips, check_src, check_tensor, load_pt, natural_key, safe_tags, scalar_tags,
)
from workbench.capture.importers.base import Importer
from workbench.capture.writer import CaptureWriter
from workbench.errors import ImporterError, UnsafeFileError, UnsafePathError

__all__ = ["FlashInferImporter", "signature_names", "tensor_name"]

_FLUSH = re.compile(r"flush_(\d+)")
_ARG = re.compile(r"arg_(\d+)((?:__\d+)*)$")


def signature_names(sig: str) -> list[str]:
    """Parameter names of a ``str(inspect.signature(f))``, in order (``*``, ``/`` markers dropped,
    ``*args``/``**kw`` kept bare): ``"(self, q, kv: Tuple[int, int] = (1, 2), *, lse=False)"`` ->
    ``["self", "q", "kv", "lse"]``."""
    s = str(sig or "").strip()
    if not (s.startswith("(") and ")" in s):
        return []
    depth, cur, parts, quote = 0, "", [], None
    body = s[1:s.rfind(")")] if "->" not in s else s[1:s.rfind(")", 0, s.rfind("->"))]
    for ch in body:
        if quote:
            cur += ch
            if ch == quote:
                quote = None
            continue
        if ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        cur += ch
    parts.append(cur)
    names = []
    for p in parts:
        p = p.strip()
        if p in ("", "*", "/"):
            continue
        m = re.match(r"\**([A-Za-z_]\w*)", p)
        if m:
            names.append(m.group(1))
    return names


def tensor_name(key: str, params: list[str], kind: str) -> str:
    """The capture name of a dumped tensor key: ``arg_1`` -> ``input.q``, ``arg_2__0`` ->
    ``input.paged_kv_cache.0``, ``kwarg_out`` -> ``input.out``, ``result`` -> ``output``,
    ``result_1`` -> ``output.1``."""
    if kind == "outputs":
        if key == "result":
            return "output"
        if key.startswith("result_"):
            return "output." + key[len("result_"):].replace("__", ".")
        return "output." + key.replace("__", ".")
    if key.startswith("kwarg_"):
        return "input." + key[len("kwarg_"):].replace("__", ".")
    m = _ARG.match(key)
    if m:
        i = int(m.group(1))
        base = params[i] if i < len(params) else f"arg{i}"
        return "input." + base + m.group(2).replace("__", ".")
    return "input." + key.replace("__", ".")


def _records(path: Path) -> list[dict]:
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ImporterError(f"cannot read {path.name}: {e}", file=path, fix="re-dump the call") from None
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line, parse_constant=lambda c: c)  # NaN/Infinity kept as text
        except json.JSONDecodeError as e:
            raise ImporterError(f"line {i} is not JSON ({e.msg})", file=path,
                                fix="the dump was cut while writing; re-dump the call or skip it") from None
        if isinstance(rec, dict):
            out.append(rec)
    return out


def _scalar_args(meta: dict, params: list[str]) -> dict:
    tags = {}
    for key, v in (meta or {}).items():
        if isinstance(v, dict) and "value" in v and v.get("type") in ("torch.dtype", "enum"):
            v = v["value"]
        if isinstance(v, (str, int, float, bool)) or v is None:
            name = tensor_name(key, params, "inputs")[len("input."):]
            tags[f"arg.{name}"] = v
    return tags


class FlashInferImporter(Importer):
    name = "flashinfer"
    description = "FlashInfer API logging (FLASHINFER_LOGLEVEL=10): one folder per API call"

    def run(self, src: str | os.PathLike, dst: str | os.PathLike, *, arm: str | None = None,
            run: dict | None = None, on_error: str = "raise", step_from: str = "auto", layers: int = 0,
            include: str = "", exclude: str = "", overwrite: bool = False) -> Path:
        """Import ``src`` (a ``FLASHINFER_DUMP_DIR``) into a new capture at ``dst``.

        Parameters
        ----------
        arm: arm name (default: the folder's name)
        run: extra run metadata; ``run["importer"]`` gets the source, counts, skipped files and
            the step marker used
        on_error: "raise" (default) or "skip" (list unreadable calls in the run metadata)
        step_from: function-name pattern (fnmatch) whose calls start a step, "auto" (a ``*.plan``
            function when the dump has one) or "none"
        layers: with no step marker, each function's calls cycle over this many layers per step
        include, exclude: comma-separated function-name patterns to import / leave out
        overwrite: replace an existing capture at ``dst``
        """
        root = check_src(src)
        skips = Skips(on_error, root)
        if not isinstance(layers, int) or layers < 0:
            raise ImporterError(f"layers must be an int >= 0, got {layers!r}", key="layers",
                                fix="pass the number of layers, or 0")
        incl = [p.strip() for p in str(include or "").split(",") if p.strip()]
        excl = [p.strip() for p in str(exclude or "").split(",") if p.strip()]
        calls = self._calls(root, skips)
        calls = [c for c in calls if (not incl or any(fnmatch.fnmatchcase(c["function"], p) for p in incl))
                 and not any(fnmatch.fnmatchcase(c["function"], p) for p in excl)]
        if not calls:
            raise ImporterError("no FlashInfer call folders (with metadata.jsonl) found" +
                                (f"; {len(skips.items)} skipped" if skips.items else ""), file=root,
                                fix="point SRC at FLASHINFER_DUMP_DIR of a run with FLASHINFER_LOGLEVEL=10")
        self._order(root, calls)
        marker = self._marker(calls, step_from)
        self._keys(calls, marker, layers)

        meta = dict(run or {})
        info = {"kind": self.name, "source": str(root.resolve()), "calls": len(calls),
                "options": {"on_error": on_error, "step_from": step_from, "layers": layers,
                            "include": include, "exclude": exclude},
                "step_marker": marker, "processes": {str(p): r for p, r in self._ranks.items()}}
        imported = 0
        from workbench.progress import progress

        with CaptureWriter(dst, arm=arm or root.resolve().name, run=meta, overwrite=overwrite) as w:
            for c in progress(calls, desc=f"import flashinfer {root.name}", unit="call", min_total=50):
                for kind in ("inputs", "outputs"):
                    try:
                        tensors = self._load(c["dir"], kind, c["format"])
                    except (UnsafeFileError, ImporterError) as err:
                        skips(err)
                        continue
                    for key, t in tensors.items():
                        name = tensor_name(key, c["params"], kind)
                        w.add(t, rank=c["rank"], step=c["step"], layer=c["layer"], op=c["function"], name=name,
                              **safe_tags({**c["tags"], **({"graph_flush": c["flush"]} if c["flush"] else {})}))
                        imported += 1
            info.update(imported=imported, skipped=skips.summary())
            meta["importer"] = info
            w.run = meta
        return Path(dst)

    # -- helpers -------------------------------------------------------------------------------
    def _calls(self, root: Path, skips: Skips) -> list[dict]:
        calls = []
        for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
            d = Path(dirpath)
            dirnames[:] = sorted(n for n in dirnames if not n.startswith(".") and n != "graph_flushes")
            if "metadata.jsonl" not in filenames:
                continue
            if (d / "metadata.jsonl").is_symlink():
                skips(UnsafePathError("metadata.jsonl is a link", file=d / "metadata.jsonl",
                                      fix="copy the dump without links"))
                continue
            try:
                recs = _records(d / "metadata.jsonl")
                if not recs or not isinstance(recs[-1].get("function_name"), str):
                    raise ImporterError("metadata.jsonl has no record with a function_name", file=d / "metadata.jsonl",
                                        fix="re-dump the call, or skip it with on_error='skip'")
            except ImporterError as err:
                skips(err)
                continue
            last = recs[-1]
            flushes = sorted(((int(m.group(1)), p) for p in (d / "graph_flushes").glob("flush_*")
                              if p.is_dir() and (m := _FLUSH.fullmatch(p.name))), key=lambda x: x[0]) \
                if (d / "graph_flushes").is_dir() else []
            params = signature_names(last.get("function_signature", ""))
            base = dict(function=last["function_name"], seq=int(last.get("call_sequence") or 0),
                        timestamp=str(last.get("timestamp", "")), pid=last.get("process_id"),
                        format="safetensors" if last.get("tensor_format") == "safetensors" else "torch",
                        params=params, rel=d.relative_to(root).as_posix(),
                        tags={"pid": last.get("process_id"), "call_sequence": last.get("call_sequence"),
                              "timestamp": str(last.get("timestamp", "")),
                              "status": str(last.get("execution_status", "")),
                              **scalar_tags(_scalar_args(last.get("input_metadata"), params))})
            for k, p in (flushes or [(0, d)]):
                calls.append({**base, "dir": p, "flush": k})
        return calls

    def _order(self, root: Path, calls: list[dict]) -> None:
        """Causal order: session.jsonl's, else (timestamp, pid, call sequence); ranks by pid."""
        pos: dict[str, int] = {}
        session = root / "session.jsonl"
        if session.is_file() and not session.is_symlink():
            try:
                for i, rec in enumerate(_records(session)):
                    d = rec.get("dump_dir")
                    if isinstance(d, str):
                        pos.setdefault(Path(d).name, i)
            except ImporterError:
                pos = {}
        big = 1 << 60
        calls.sort(key=lambda c: (c["flush"], pos.get(Path(c["rel"]).name, big), c["timestamp"], str(c["pid"]),
                                  c["seq"], natural_key(c["rel"])))
        self._ranks: dict = {}
        for c in calls:
            self._ranks.setdefault(c["pid"], len(self._ranks))
            c["rank"] = self._ranks[c["pid"]]

    @staticmethod
    def _marker(calls: list[dict], step_from: str) -> str | None:
        if step_from in (None, "", "none"):
            return None
        funcs = sorted({c["function"] for c in calls})
        if step_from == "auto":
            plans = [f for f in funcs if fnmatch.fnmatchcase(f, "*.plan")]
            return plans[0] if len(plans) == 1 else ("*.plan" if plans else None)
        if not any(fnmatch.fnmatchcase(f, step_from) for f in funcs):
            raise ImporterError(f"step_from {step_from!r} matches no function of the dump", key="step_from",
                                fix=f"pass a pattern matching one of {funcs[:12]}, 'auto' or 'none'")
        return step_from

    @staticmethod
    def _keys(calls: list[dict], marker: str | None, layers: int) -> None:
        per: dict = defaultdict(int)          # (pid, flush, function) -> calls so far
        step_of: dict = defaultdict(lambda: -1)  # (pid, flush) -> marker calls so far
        in_step: dict = defaultdict(int)      # (pid, flush, step, function) -> calls in this step
        for c in calls:
            pid, fl, f = c["pid"], c["flush"], c["function"]
            if marker is not None:
                if fnmatch.fnmatchcase(f, marker):
                    step_of[(pid, fl)] += 1
                step = max(step_of[(pid, fl)], 0)
                k = in_step[(pid, fl, step, f)]
                in_step[(pid, fl, step, f)] += 1
                c["step"], c["layer"] = step, k
            else:
                k = per[(pid, fl, f)]
                per[(pid, fl, f)] += 1
                c["step"], c["layer"] = (k // layers, k % layers) if layers else (k, -1)
        if marker is not None:  # a function called at most once in every step has no layer
            most: dict = defaultdict(int)
            for (pid, fl, step, f), n in in_step.items():
                most[f] = max(most[f], n)
            for c in calls:
                if most[c["function"]] <= 1:
                    c["layer"] = -1
        # a graph replay's flush k comes after the process's eager steps: step eager_steps + k - 1
        eager: dict = defaultdict(int)
        for c in calls:
            if not c["flush"]:
                eager[c["pid"]] = max(eager[c["pid"]], c["step"] + 1)
        for c in calls:
            if c["flush"]:
                c["step"] = eager[c["pid"]] + c["flush"] - 1

    @staticmethod
    def _load(d: Path, kind: str, fmt: str) -> dict:
        st, pt = d / f"{kind}.safetensors", d / f"{kind}.pt"
        path = st if (fmt == "safetensors" or not pt.exists()) and st.exists() else pt
        if not path.exists():
            return {}  # a call that crashed before its outputs, or took no tensor
        if path.is_symlink():
            raise UnsafePathError(f"{path.name} is a link", file=path, fix="copy the dump without links")
        if path.suffix == ".safetensors":
            from safetensors import SafetensorError
            from safetensors.torch import load_file

            try:
                obj = load_file(str(path))
            except (SafetensorError, OSError, ValueError) as e:
                raise ImporterError(f"cannot read {path.name}: {e}", file=path, fix="re-dump the call") from None
        else:
            obj = load_pt(path)
        if isinstance(obj, torch.Tensor):
            obj = {"result": obj}
        if not isinstance(obj, dict):
            raise UnsafeFileError(f"{path.name} holds a {type(obj).__name__}, not a dict of tensors", file=path,
                                  fix="import FlashInfer level-10 dumps only, or skip this call with on_error='skip'")
        return {str(k): check_tensor(v, path, f"tensor {k!r}") for k, v in obj.items()}
