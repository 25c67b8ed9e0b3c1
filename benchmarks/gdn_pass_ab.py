"""A/B of the GDN mma prefill's two passes: the warp-resident pass and the shared-memory pass,
each forced (WORKBENCH_GDN_MMA_PASS, read by the launcher at each call), with fla's
chunk_gated_delta_rule alongside, over the prefill shapes of gdn_matrix.py, in one process. Times
are CUDA-graph replays (median of triton's do_bench); "auto" is the launcher's own choice
(auto_plan: the pass ext.mma_pass names; auto_took: the forced pass(es) auto matched bit for bit).

    python benchmarks/gdn_pass_ab.py --out benchmarks/results/gdn-pass-ab-h200-YYYY-MM-DD.json
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

VARIANTS = ("warp", "smem", "auto")


def _force(label: str):
    os.environ["WORKBENCH_GDN_MMA_PASS"] = label


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    chunk, _ = _fla()
    rows = []
    # the grids the launcher gives the warp-resident pass (most warps) first
    for name, B, T, H, HV, K, V, norm in sorted(PREFILL, key=lambda r: -r[1] * r[4] * r[6]):
        ours, peer, lengths, _, dtype = prefill_calls(chunk, B, T, H, HV, K, V, norm)
        # the launcher's rule (packed batches run one launch per sequence: B = 1)
        row = {"shape": name, "auto_plan": ext.mma_pass(1 if lengths else B, HV, V, dtype)}
        outs = {}
        for label in VARIANTS:
            _force(label)
            outs[label] = ours()
            row[f"ms_{label}"] = _bench(_graphed(ours))
        of, _ = peer()
        row["ms_fla"] = _bench(_graphed(peer))
        for label in VARIANTS:
            row[f"ratio_{label}"] = row["ms_fla"] / row[f"ms_{label}"]
        row["auto_took"] = [v for v in ("warp", "smem")
                            if torch.equal(outs["auto"][0], outs[v][0])
                            and torch.equal(outs["auto"][1], outs[v][1])]
        row["rel_o_warp_vs_smem"] = _rel(outs["warp"][0], outs["smem"][0])
        row["rel_state_warp_vs_smem"] = _rel(outs["warp"][1], outs["smem"][1])
        row["rel_o_warp_vs_fla"] = _rel(outs["warp"][0], of)
        rows.append(row)
        print(json.dumps(row), flush=True)
        _write(args.out, rows)
    print("summary:", json.dumps(_write(args.out, rows)))


def _write(path: Path, rows: list) -> dict:
    """The results so far (rewritten after each shape, so a cut run keeps what it measured)."""
    summary = {f"min_ratio_{v}": min(r[f"ratio_{v}"] for r in rows) for v in VARIANTS}
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
