"""The ``workbench`` command: inspect, verify, import and compare captures; regenerate samples."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from workbench.errors import WorkbenchError

__all__ = ["main"]


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n}"


def cmd_inspect(args) -> int:
    import pandas as pd

    from workbench.capture import open_capture

    cap = open_capture(args.capture)
    if args.verify:
        cap.verify()
    print(f"capture  {cap.path}")
    print(f"arm      {cap.arm}")
    print(f"created  {cap.created}")
    print(f"tensors  {len(cap)} in {len(cap.shards)} shard(s), {_fmt_bytes(cap.total_bytes)}")
    idx = cap.index
    if len(idx):
        for f in ("rank", "step", "layer"):
            vals = sorted(idx[f].unique().tolist())
            span = f"{vals[0]}..{vals[-1]}" if len(vals) > 6 else ", ".join(map(str, vals))
            print(f"{f:<8} {span} ({len(vals)})")
    if cap.run:
        print("run:")
        for k, v in cap.run.items():
            s = json.dumps(v) if not isinstance(v, str) else v
            print(f"  {k}: {s if len(s) < 200 else s[:197] + '...'}")
    with pd.option_context("display.width", 200, "display.max_rows", 200):
        print()
        print(cap.summary().to_string(index=False))
    if args.keys:
        with pd.option_context("display.width", 200, "display.max_rows", None):
            print()
            print(idx[["seq", "rank", "step", "layer", "op", "name", "dtype", "shape"]].to_string(index=False))
    return 0


class _cluster:
    """``with _cluster(args) as client``: a dask client for --scheduler/--workers (closed, with
    its local cluster, on exit), or None."""

    def __init__(self, args) -> None:
        self.scheduler = getattr(args, "scheduler", None)
        self.workers = getattr(args, "workers", None)
        self.client = None

    def __enter__(self):
        if self.scheduler or self.workers:
            from workbench.analysis.distributed import connect

            self.client = connect(self.scheduler, workers=self.workers)
            info = self.client.scheduler_info()
            print(f"dask: {len(info.get('workers', {}))} worker(s) at {info.get('address', self.scheduler)}",
                  file=sys.stderr)
        return self.client

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            cluster = self.client.cluster if self.workers else None
            self.client.close()
            if cluster is not None:
                cluster.close()


def _cluster_args(s) -> None:
    s.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run on the dask.distributed cluster at ADDRESS (tcp://HOST:PORT); every worker must see "
                        "the captures at the same path (docs/scale.md)")
    s.add_argument("--workers", type=int, default=None, metavar="N",
                   help="start a local dask cluster of N worker processes for this run")


def cmd_verify(args) -> int:
    from workbench.capture import open_capture

    cap = open_capture(args.capture)  # opening checks every manifest entry; verify checks the shards
    with _cluster(args) as client:
        report = cap.verify(raise_on_error=False, client=client)
    print(report)
    return 0 if report.ok else 1


def cmd_import(args) -> int:
    from workbench.capture.importers import import_capture

    if args.list or not args.kind:
        return _list_importers()
    if not args.src or not args.dst:
        raise WorkbenchError(f"workbench import {args.kind} needs SRC and DST", key="import",
                             fix=f"run: workbench import {args.kind} DUMP_FOLDER CAPTURE_FOLDER (workbench import --list "
                                 "shows every kind)")

    options = {}
    for item in args.option or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise WorkbenchError(f"bad option {item!r}", key="--option", fix="write options as NAME=VALUE")
        options[k] = v
    if "run" in options:  # run metadata from the command line is a JSON object
        options["run"] = _json_object(options["run"], "-o run")
    if args.pattern is not None:
        options["pattern"] = args.pattern
    cap = import_capture(args.kind, args.src, args.dst, arm=args.arm, **options)
    print(f"imported {len(cap)} tensors into {cap.path} (arm {cap.arm})")
    return 0


def _list_importers() -> int:
    """Every importer kind, whether it can run here, and its options."""
    import inspect

    from workbench.capture.importers import get_importer, importers

    for info in importers():
        state = "available" if info.available else f"unavailable: {info.reason}"
        print(f"{info.name:<12} {info.description} ({info.source}; {state})")
        if info.available:
            sig = inspect.signature(type(get_importer(info.name)).run)
            opts = [p.name for p in sig.parameters.values() if p.kind == p.KEYWORD_ONLY and p.name not in ("arm", "run")]
            if opts:
                print(f"{'':<12} options (-o NAME=VALUE): {', '.join(opts)}")
    return 0


def _json_object(text: str, what: str) -> dict:
    try:
        v = json.loads(text)
    except ValueError:
        v = None
    if not isinstance(v, dict):
        raise WorkbenchError(f"{what} must be a JSON object, got {text!r}", key=what,
                             fix=f"""write {what}='{{"model": "qwen3-next", "commit": "abc"}}'""")
    return v


def _writable_file(path: str, what: str) -> Path:
    """A file we may create or replace, checked before any work is done."""
    p = Path(path)
    if p.is_dir():
        raise WorkbenchError(f"{what} {path!r} is a directory", file=p, key=what, fix=f"pass a file name to {what}")
    if not p.parent.is_dir():
        raise WorkbenchError(f"the folder of {what} {path!r} does not exist", file=p.parent, key=what,
                             fix="create the folder first or choose another path")
    if not os.access(p.parent, os.W_OK):
        raise WorkbenchError(f"the folder of {what} {path!r} is not writable", file=p.parent, key=what,
                             fix="choose a writable location")
    return p


EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT, EXIT_MISSING_KEYS = 0, 1, 2, 3


def cmd_compare(args) -> int:
    from workbench.analysis.compare import Rule, compare_captures
    from workbench._atomic import atomic_write_json

    rules = []
    for spec in args.rule or []:
        # PATTERN:METRIC=THRESHOLD, e.g. "lm_head/*:rel_l2=1e-2"
        pat, _, rest = spec.rpartition(":")
        metric, _, thr = rest.partition("=")
        try:
            value = float(thr)
        except ValueError:
            raise WorkbenchError(f"bad --rule {spec!r}: threshold {thr!r} is not a number", key="--rule",
                                 fix="write PATTERN:METRIC=THRESHOLD, e.g. 'lm_head/*:rel_l2=1e-2'") from None
        rules.append(Rule(pattern=pat or "*", metric=metric, threshold=value))
    out = _writable_file(args.json, "--json") if args.json else None
    partition = None
    if args.partition:
        partition = [p.strip() for p in args.partition.split(",") if p.strip()]
    with _cluster(args) as client:
        res = compare_captures(args.control, args.candidate, aa=args.aa, rules=rules or None, dtype=args.dtype,
                               verify=args.verify, grouping=args.grouping, align=args.align, client=client,
                               partition=partition)
    print(res.report(rows=args.rows))
    if out is not None:
        atomic_write_json(out, json.loads(json.dumps(res.to_dict(), default=str)), indent=1)
        print(f"\nwrote {out}")
    if res.first_divergence() is not None:
        return EXIT_DIVERGED
    if not res.same_keys and not args.allow_missing:
        print("the arms do not hold the same keys (exit 3; --allow-missing accepts that)", file=sys.stderr)
        return EXIT_MISSING_KEYS
    return EXIT_OK


def cmd_samples(args) -> int:
    from workbench.models.sample import write_samples

    paths = write_samples(args.out, overwrite=True)
    for p in paths:
        print(f"wrote {p}")
    return 0


def cmd_run(args) -> int:
    from workbench.runner import load_params_file, run_notebooks

    params = []
    for f in args.params_file or []:
        params += load_params_file(f)
    params += [tuple(p) for p in args.parameter or []]
    out = Path(args.out)
    for parent in (out, *out.parents):
        if parent.exists() and not parent.is_dir():
            raise WorkbenchError(f"--out {args.out!r}: {parent} is a file, not a folder", file=parent, key="--out",
                                 fix="pass a folder (it is created if missing)")
    res = run_notebooks(args.notebooks or None, parameters=params, out=args.out,
                        timeout=args.timeout, html_reports=not args.no_html, show_code=args.show_code,
                        jobs=args.jobs, pdf=args.pdf)
    print(f"\nreports in {res.out}/index.html, gates in {res.out}/results.json")
    failed = [r for r in res.notebooks if r.status != "passed"]
    if failed:
        print(f"{len(failed)} of {len(res.notebooks)} notebook(s) failed:", file=sys.stderr)
        for r in failed:
            print(r.describe(), file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="workbench", description=__doc__)
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bars (they show only on a terminal anyway; also WORKBENCH_QUIET=1)")
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("inspect", help="show what a capture holds")
    s.add_argument("capture")
    s.add_argument("--keys", action="store_true", help="list every tensor key")
    s.add_argument("--verify", action="store_true", help="check every shard (sha256, header) first")
    s.set_defaults(func=cmd_inspect)

    s = sub.add_parser("verify", help="check every shard's size and sha256")
    s.add_argument("capture")
    _cluster_args(s)
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("import", help="turn another engine's dump into a capture")
    s.add_argument("kind", nargs="?", help="importer name (sglang, flashinfer, folder, ...; --list shows them all)")
    s.add_argument("src", nargs="?")
    s.add_argument("dst", nargs="?")
    s.add_argument("--list", action="store_true", help="list the importer kinds, their availability and options")
    s.add_argument("--arm", default=None)
    s.add_argument("--pattern", default=None, help="folder importer: e.g. 'rank{rank}/step{step}/{op}.{layer}.{name}.pt'")
    s.add_argument("-o", "--option", action="append", help="importer option NAME=VALUE (repeatable)")
    s.set_defaults(func=cmd_import)

    s = sub.add_parser("compare", help="compare two captures and report the first divergence",
                       description="Compare two captures key by key. Exit status: 0 no divergence and the same "
                                   "keys in both arms; 1 a key diverged beyond its threshold; 2 bad input; 3 no "
                                   "divergence, but some keys are in one arm only (see --allow-missing).")
    s.add_argument("control")
    s.add_argument("candidate")
    s.add_argument("--aa", default=None, help="an A/A repeat of the control: per-key noise thresholds")
    s.add_argument("--rule", action="append", help="PATTERN:METRIC=THRESHOLD (repeatable, first match wins)")
    s.add_argument("--dtype", default=None, help="ULP format (bf16, fp16, fp32, fp64)")
    s.add_argument("--json", default=None, help="write the full result as JSON")
    s.add_argument("--rows", type=int, default=20, help="rows of the table to print")
    s.add_argument("--verify", action="store_true",
                   help="check each shard's sha256 once, at its first read (one extra read of the data)")
    s.add_argument("--allow-missing", action="store_true",
                   help="exit 0 (not 3) when no key diverges but the arms do not hold the same keys")
    s.add_argument("--grouping", choices=("auto", "logical", "raw"), default="auto",
                   help="logical: rebuild each tensor from its ranks with its dims spec (TP1 vs TP2...); raw: rank by "
                        "rank; auto (default): logical when the arms' layouts differ, rank by rank when they match")
    s.add_argument("--align", choices=("auto", "tokens", "steps"), default="auto",
                   help="tokens: pair the candidate's token rows with the control's by (request, position) "
                        "(chunked vs unchunked prefill, batched vs alone); steps: step with step; auto (default): "
                        "tokens when every capture records its batch rows")
    _cluster_args(s)
    s.add_argument("--partition", default=None, metavar="FIELDS",
                   help="with --scheduler/--workers: the key fields of one task (default rank,step; 'shard' groups "
                        "by the control's shard file)")
    s.set_defaults(func=cmd_compare)

    s = sub.add_parser("run", help="execute notebooks (papermill), write HTML reports and a gate verdict",
                       description="Execute parameterized notebooks headless with the current interpreter's "
                                   "kernel; write executed notebooks, offline HTML, results.json and index.html; "
                                   "exit 1 naming the notebook, cell and gate that failed.")
    s.add_argument("notebooks", nargs="*", help="notebook paths (default: every notebooks/*.ipynb)")
    s.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="set a parameter (NAME or NOTEBOOK.NAME), converted to its declared type (repeatable)")
    s.add_argument("-f", "--params-file", action="append", metavar="YAML",
                   help="YAML mapping NAME: VALUE or NOTEBOOK: {NAME: VALUE} (repeatable; -p wins)")
    s.add_argument("--out", default="reports", help="report folder (default: reports)")
    s.add_argument("--timeout", type=float, default=300, help="seconds allowed to each cell (default 300)")
    s.add_argument("--no-html", action="store_true", help="skip the HTML export")
    s.add_argument("--show-code", action="store_true",
                   help="write each report with its code open (default: folded under each cell's \"code\")")
    s.add_argument("--pdf", action="store_true",
                   help="also print each report to <name>.pdf with headless Chromium (for reviews that take files)")
    s.add_argument("-j", "--jobs", type=int, default=None, metavar="N",
                   help="notebooks run at once, each in its own kernel (default: the machine's cores, at most 4)")
    s.set_defaults(func=cmd_run)

    s = sub.add_parser("samples", help="regenerate the bundled sample captures")
    s.add_argument("--out", default="captures")
    s.set_defaults(func=cmd_samples)
    return p


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # names from dumps may hold text the terminal cannot encode
        if hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):
                pass
    args = build_parser().parse_args(argv)
    if getattr(args, "quiet", False):
        os.environ["WORKBENCH_QUIET"] = "1"  # workbench.progress.QUIET_ENV, without importing it here
    try:
        return args.func(args)
    except WorkbenchError as e:
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:
        # the reader of our output went away (`workbench inspect CAP | head`): stop quietly
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 141
    except OSError as e:  # a file the command was pointed at cannot be read or written
        where = e.filename if e.filename is not None else "?"
        print(f"error: {type(e).__name__}: {e.strerror or e}\n  file: {where}\n  fix:  check the path and "
              f"its permissions", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
