"""Sharding arithmetic on one device (issue 16, item 5): which TP layout reproduces a run bitwise.

Runs of known layouts are built with the split-K GEMM itself (as a TP run's per-rank slices and
fixed-order all-reduce compute them) and by the hybrid decoder at TP1 and TP4; the replay must
name the layout, and must refuse to name one where the data cannot tell."""

from pathlib import Path

import pytest
import torch

from workbench.analysis.sharding import (projection_hypotheses, reduction_replay, replay_projection,
                                         sharding_replay)
from workbench.capture import CaptureWriter
from workbench.capture.importers import import_capture
from workbench.errors import AnalysisError, KeyNotFoundError
from workbench.kernels.gemm.torch_ref import slice_product
from workbench.models.hybrid import ArmConfig, HybridDecoder, RecordSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "sglang_tp"
TP = 4


def _bf16_values(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).bfloat16().float()


def _ranked(x, w, tp, split, partial="fp32"):
    """What tp ranks compute: K split over the ranks (row-parallel; each rank's slice summed in
    fp32, partials all-reduced in rank order) or whole (column-parallel: every element one sum)."""
    if not split:
        return slice_product(x, w)
    k = x.shape[1] // tp
    parts = [slice_product(x[:, r * k:(r + 1) * k], w[:, r * k:(r + 1) * k]) for r in range(tp)]
    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[partial]
    acc = parts[0].to(dt).float()
    for p in parts[1:]:
        acc = acc + p.to(dt).float()
    return acc, parts


def _write_block(path, *, up_split, down_split, tp=TP, partial="fp32"):
    x = _bf16_values(6, 32, seed=1)
    wg, wu, wd = _bf16_values(64, 32, seed=2), _bf16_values(64, 32, seed=3), _bf16_values(32, 64, seed=4)
    gate = _ranked(x, wg, tp, up_split)[0] if up_split else _ranked(x, wg, tp, False)
    up = _ranked(x, wu, tp, up_split)[0] if up_split else _ranked(x, wu, tp, False)
    act = torch.nn.functional.silu(gate) * up
    if down_split:
        out, parts = _ranked(act, wd, tp, True, partial)
    else:
        out, parts = _ranked(act, wd, tp, False), None
    w = CaptureWriter(path, arm=path.name, run={"parallel": {"tp_size": tp}})
    for name, t in (("input", x), ("gate", gate), ("up", up), ("act", act), ("output", out),
                    ("w_gate", wg), ("w_up", wu), ("w_down", wd)):
        w.add(t, layer=2, op="ffn", name=name)
    if parts is not None:
        for r, p in enumerate(parts):
            w.add(p.to(torch.bfloat16).float() if partial == "bf16" else p, rank=r, layer=2, op="ffn", name="partial",
                  dims="t h[tp:partial]", tp_rank=r, tp_size=tp)
    w.close()
    return path


NAMES = {role: f"ffn/{role}" for role in ("input", "gate", "up", "act", "partial", "output", "w_gate", "w_up", "w_down")}


@pytest.mark.parametrize("up_split,down_split,layout", [(False, False, "none"), (False, True, "down-only"),
                                                         (True, False, "up-only"), (True, True, "both")])
def test_each_layout_is_named(tmp_path, up_split, down_split, layout):
    path = _write_block(tmp_path / layout, up_split=up_split, down_split=down_split)
    rep = sharding_replay(path, layer=2, step=0, names=NAMES)
    assert rep.tp == TP  # from run["parallel"]
    assert rep.layout == layout, rep.finding
    assert rep.finding.startswith(f"layer 2 step 0, tp={TP}: {layout} reproduces the run bitwise")
    # exactly the true hypothesis reproduces each projection (the others differ somewhere)
    for proj, split in (("gate", up_split), ("up", up_split), ("down", down_split)):
        hits = rep.table[(rep.table["projection"] == proj) & rep.table["bitwise"]]
        assert hits["ranks"].tolist() == [TP if split else 1], (proj, hits)
        assert hits["partial_dtype"].tolist() == ["fp32"] and hits["order"].tolist() == ["sequential"]


def test_bf16_partials_found_in_the_gemm_and_in_the_all_reduce(tmp_path):
    path = _write_block(tmp_path / "bf16", up_split=False, down_split=True, partial="bf16")
    rep = sharding_replay(path, layer=2, step=0, names=NAMES)
    assert rep.layout == "down-only"
    down = rep.table[(rep.table["projection"] == "down") & rep.table["bitwise"]]
    # 4 bf16 partials sum exactly in fp32 here, so the order cannot be told (both orders reproduce)
    assert set(map(tuple, down[["ranks", "partial_dtype"]].values.tolist())) == {(TP, "bf16")}
    assert "sequential" in down["order"].tolist()
    # the captured partials hold bf16 values: every rank is flagged, and their fp32 sum is the output
    assert [r["representable_in"] for r in rep.ranks] == ["bf16"] * TP
    assert bool(rep.reductions.iloc[0]["bitwise"]) and rep.reductions.iloc[0]["order"] == "sequential"
    assert "hold a partial of bf16 values only" in rep.finding


def test_undetermined_when_nothing_reproduces(tmp_path):
    path = _write_block(tmp_path / "x", up_split=False, down_split=True)
    from workbench.capture import open_capture

    cap = open_capture(path)
    out = cap.get(layer=2, op="ffn", name="output").clone()
    out[0, 0] = torch.nextafter(out[0, 0], torch.tensor(float("inf")))  # one ulp away: no layout is that run
    w = CaptureWriter(tmp_path / "y", arm="y", run={"parallel": {"tp_size": TP}})
    for _, row in cap.index.iterrows():
        t = cap._tensor(row)
        w.add(out if row["name"] == "output" else t, rank=int(row["rank"]), layer=2, op="ffn", name=row["name"],
              **(row["tags"] or {}))
    w.close()
    rep = sharding_replay(tmp_path / "y", layer=2, step=0, names=NAMES)
    assert rep.layout is None and "layout undetermined" in rep.finding
    best = rep.table[rep.table["projection"] == "down"].iloc[0]
    assert not best["bitwise"] and best["mismatched"] == 1 and best["ranks"] == TP  # closest: the true one


def test_replay_projection_is_the_tp_arithmetic():
    x, w = _bf16_values(3, 48, seed=5), _bf16_values(16, 48, seed=6)
    out, _ = _ranked(x, w, 3, True)
    assert torch.equal(replay_projection(x, w, ranks=3), out)
    assert torch.equal(replay_projection(x, w, ranks=1), slice_product(x, w))
    with pytest.raises(AnalysisError, match="cannot be split over 5 ranks"):
        replay_projection(x, w, ranks=5)
    with pytest.raises(AnalysisError, match="fits neither"):
        projection_hypotheses(x, w[:, :8], out, tp=3)
    # a transposed weight ([K, N]) is taken as such
    t = projection_hypotheses(x, w.t().contiguous(), out, tp=3)
    assert t.iloc[0]["bitwise"] and t.iloc[0]["ranks"] == 3


def test_hybrid_decoder_tp4_is_down_only_and_tp1_none(tmp_path):
    model = HybridDecoder()
    spec = RecordSpec(detail_steps=(0, 1), every_step=(), prefill_positions=4, mlp_detail=(0,))
    for tp in (1, 4):
        w = CaptureWriter(tmp_path / f"tp{tp}", arm=f"tp{tp}")
        model.generate(model.prompt(32), steps=1, arm=ArmConfig(tp=tp), writer=w, spec=spec)
        w.close()
    for tp, layout in ((1, "none"), (4, "down-only")):
        for step in (0, 1):
            rep = sharding_replay(tmp_path / f"tp{tp}", layer=0, step=step, tp=4 if tp == 1 else None)
            assert rep.tp == 4 and rep.layout == layout, rep.finding
    rep = sharding_replay(tmp_path / "tp4", layer=0, step=1)
    assert bool(rep.reductions.iloc[0]["bitwise"]) and rep.reductions.iloc[0]["order"] == "sequential"
    assert [r["representable_in"] for r in rep.ranks] == ["fp32"] * 4
    with pytest.raises(KeyNotFoundError, match="no projection of layer 1 step 0 can be replayed"):
        sharding_replay(tmp_path / "tp4", layer=1, step=0)
    with pytest.raises(AnalysisError, match="unknown role"):
        sharding_replay(tmp_path / "tp4", layer=0, names={"weights": "mlp/w"})


def test_sglang_dump_all_reduce_and_the_rank_that_rounded(tmp_path):
    """SGLang's own dumper at TP2: no weights dumped, so no projection is replayed; the all-reduce
    of the ranks' partials is, and the planted bf16 partial (layer 1, rank 1) shows."""
    for name in ("tp2", "tp2-bf16"):
        import_capture("sglang", FIXTURES / name, tmp_path / name)
    names = {"partial": "mlp_partial/value", "output": "mlp_output/value", "act": "mlp_up/value"}
    for name, layer, bf16_ranks in (("tp2", 1, []), ("tp2-bf16", 0, []), ("tp2-bf16", 1, [1])):
        rep = sharding_replay(tmp_path / name, layer=layer, step=0, names=names)
        assert rep.tp == 2 and rep.table.empty and rep.layout is None
        assert bool(rep.reductions.iloc[0]["bitwise"]), rep.reductions
        got = [r["rank"] for r in rep.ranks if r["representable_in"] == "bf16"]
        assert got == bf16_ranks, rep.ranks
        assert ("rank 1 holds a partial of bf16 values only" in rep.finding) == bool(bf16_ranks)
    with pytest.raises(AnalysisError, match="differ in shape"):
        reduction_replay([torch.zeros(2, 3), torch.zeros(2, 4)], torch.zeros(2, 3))


def test_role_names_parse_and_refuse():
    from workbench.analysis.sharding import parse_names

    assert parse_names("input=ffn/x, w_down:ffn/w2") == {"input": "ffn/x", "w_down": "ffn/w2"}
    assert parse_names("") == {}
    with pytest.raises(AnalysisError, match="is not role=op/name"):
        parse_names("weights=ffn/w")
    with pytest.raises(AnalysisError, match="is not 'op/name'"):
        parse_names("input=x")
