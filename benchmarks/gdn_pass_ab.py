"""A/B of the GDN mma prefill's passes: the warp-resident pass, the shared-memory pass and its
16-column blocks (smem16), each forced (WORKBENCH_GDN_MMA_PASS, read by the launcher at each
call), with fla's chunk_gated_delta_rule alongside, over the prefill shapes of gdn_matrix.py, in
one process. Times are CUDA-graph replays (median of triton's do_bench; with ``--rounds N`` each
variant and fla are timed in turn N times and the lowest median of each is kept); "auto" is the
launcher's own choice (auto_plan: the pass ext.mma_pass names; auto_took: the forced pass(es)
auto matched bit for bit).

    python benchmarks/gdn_pass_ab.py --out benchmarks/results/gdn-pass-ab-h200-YYYY-MM-DD.json

Any other variable the launcher reads at each call can be A/B'd the same way, e.g. who issues the
passes' copies (``--env WORKBENCH_GDN_MMA_COPY --variants warps producer two``), prepare's grid
(``--env WORKBENCH_GDN_MMA_PREPARE --variants value-head key-head``) or its substitution
(``--env WORKBENCH_GDN_MMA_SOLVE --variants short doubling full``), its gates' loads
(``--env WORKBENCH_GDN_MMA_GATES --variants load prefetch``) or how the pass is launched
(``--env WORKBENCH_GDN_MMA_PDL --variants off wait``, the dependent launch being the default; a
value the launcher does not know is its default): each row then says whether the variants' o and
final state are bit for bit those of the first variant. A variant written ``VAR=value,VAR2=value``
sets those variables instead of ``--env`` (a placeholder then), so that a combination is timed
beside its parts, e.g. ``--env X --variants WORKBENCH_GDN_MMA_PDL=off,WORKBENCH_GDN_MMA_COPY=warps
WORKBENCH_GDN_MMA_PDL=off WORKBENCH_GDN_MMA_COPY=warps`` (a variable a variant does not name
keeps the launcher's default).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gdn import _bench, _fla, _graphed, _versions  # noqa: E402
from gdn_matrix import PREFILL, _rel, prefill_calls  # noqa: E402

from workbench.kernels import gdn  # noqa: E402
from workbench.kernels.gdn import ext  # noqa: E402

VARIANTS = ("warp", "smem", "smem16", "auto")


def _settings(env: str, label: str) -> dict:
    """The variables a variant sets: ``env=label``, or the ``VAR=value`` pairs it names."""
    if "=" not in label:
        return {env: label}
    pairs = dict(item.split("=", 1) for item in label.split(","))
    bad = [k for k in pairs if not k.startswith("WORKBENCH_")]
    if bad:
        raise SystemExit(f"gdn_pass_ab: variant {label!r} sets {bad}, not a WORKBENCH_ variable; "
                         "write VAR=value,VAR2=value with the launcher's variables")
    return pairs


def _force(env: str, label: str) -> list:
    """Sets a variant's variables (cleared again after its graph is captured); returns their names."""
    settings = _settings(env, label)
    os.environ.update(settings)
    return list(settings)


def _shapes(only=None):
    """The prefill shapes to time, in order: those whose name contains one of ``only``, in the
    order of the filters they match first (so that the shapes named first are timed before a time
    limit cuts the run); otherwise every shape, the grids the launcher gives the warp-resident pass
    (most warps) first."""
    def first(row):
        return min((i for i, o in enumerate(only) if o in row[0]), default=None)
    by_size = sorted(PREFILL, key=lambda r: -r[1] * r[4] * r[6])
    if not only:
        return by_size
    return sorted((r for r in by_size if first(r) is not None), key=first)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--env", default="WORKBENCH_GDN_MMA_PASS", help="the variable the variants set")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS))
    ap.add_argument("--only", nargs="*", default=None, help="shapes whose name contains one of these")
    ap.add_argument("--rounds", type=int, default=1,
                    help="times each variant and fla in turn this many times (the lowest median each)")
    args = ap.parse_args()
    variants = args.variants
    chunk, _ = _fla()
    rows = []
    for name, B, T, H, HV, K, V, norm in _shapes(args.only):
        ours, peer, lengths, _, dtype = prefill_calls(chunk, B, T, H, HV, K, V, norm)
        # the launcher's rule (a packed batch: one launch of HV times up to 128 sequences)
        row = {"shape": name, "env": args.env,
               "auto_plan": ext.mma_pass(min(len(lengths), 128) if lengths else B, HV, V, dtype, K=K)}
        outs, graphs = {}, {}
        for label in variants:
            names = _force(args.env, label)
            outs[label] = ours()
            graphs[label] = _graphed(ours)  # the variable is read at capture: the graph keeps it
            for var in names:
                os.environ.pop(var, None)
        of, _ = peer()
        graphs["fla"] = _graphed(peer)
        # rounds of every variant and fla in turn; each side's lowest median
        for label in graphs:
            row[f"ms_{label}_runs"] = []
        for _ in range(args.rounds):
            for label, g in graphs.items():
                row[f"ms_{label}_runs"].append(_bench(g))
        for label in graphs:
            row[f"ms_{label}"] = min(row[f"ms_{label}_runs"])
        for label in variants:
            row[f"ratio_{label}"] = row["ms_fla"] / row[f"ms_{label}"]
        first = variants[0]
        for label in variants[1:]:
            row[f"bitwise_{label}_vs_{first}"] = all(torch.equal(a, b) for a, b in zip(outs[label], outs[first]))
        if {"warp", "smem", "auto"} <= set(variants):
            row["auto_took"] = [v for v in ("warp", "smem", "smem16") if v in outs
                                and torch.equal(outs["auto"][0], outs[v][0])
                                and torch.equal(outs["auto"][1], outs[v][1])]
            row["rel_o_warp_vs_smem"] = _rel(outs["warp"][0], outs["smem"][0])
            row["rel_state_warp_vs_smem"] = _rel(outs["warp"][1], outs["smem"][1])
        for label in variants:  # each variant's o against fla's (a wrong kernel shows here)
            row[f"rel_o_{label}_vs_fla"] = _rel(outs[label][0], of)
        rows.append(row)
        print(json.dumps(row), flush=True)
        _write(args.out, rows, variants)
    print("summary:", json.dumps(_write(args.out, rows, variants)))


def _write(path: Path, rows: list, variants) -> dict:
    """The results so far (rewritten after each shape, so a cut run keeps what it measured)."""
    summary = {f"min_ratio_{v}": min(r[f"ratio_{v}"] for r in rows) for v in variants}
    out = {"benchmark": "gdn_pass_ab", "command": "python " + " ".join(sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": torch.cuda.get_device_name(), "versions": _versions(),
           "timing": "CUDA-graph replay, median of triton.testing.do_bench; ratio = fla ms / ours",
           "shapes": f"{len(rows)} of {len(PREFILL)}", "summary": summary, "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=1))
    return summary


if __name__ == "__main__":
    main()
