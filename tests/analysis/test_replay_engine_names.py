"""Replay of ops under an engine's own names (issue 17, item 5): a user registers how the tensor
names FlashInfer's API logging writes map to a kernel family's arguments, in a few lines (the
code of docs/analyses.md, "Your engine's names"), and replays the captured decode attention of
tests/fixtures/flashinfer through the workbench's QSA kernels: every token selected is dense
attention."""

from pathlib import Path

import torch

from workbench.analysis import OpAdapter, register_adapter, replay
from workbench.analysis.replay import REGISTRY
from workbench.capture.importers import import_capture
from workbench.kernels import qsa
from workbench.numerics.policy import Policy

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "flashinfer"
RUN = "BatchDecodeWithPagedKVCacheWrapper.run"


# -- the user's adapter, as in docs/analyses.md --------------------------------------------------
def fi_load(cap, rank, step, layer):
    get = lambda n: cap.get(op=RUN, rank=rank, step=step, layer=layer, name=n).float()
    q, k, v = get("input.q"), get("input.paged_kv_cache.0"), get("input.paged_kv_cache.1")
    T, S = q.shape[0], k.shape[0]
    # causal: query row t sees tokens 0 .. S - T + t (the rest padded with -1)
    idx = torch.full((T, S), -1, dtype=torch.int32)
    for t in range(T):
        idx[t, :S - T + t + 1] = torch.arange(S - T + t + 1, dtype=torch.int32)
    kv = qsa.PagedKVCache.from_dense(k[None], v[None], page_size=4)
    return {"q": q, "kv": kv, "table": kv.block_table.expand(T, -1).contiguous(), "indices": idx}


def fi_run(x, backend, policy):
    o, lse = qsa.sparse_decode(x["q"], x["kv"], x["table"], x["indices"], policy=policy, backend=backend)
    return {"output.0": o}


FI_DECODE = OpAdapter(RUN, ("input.q", "input.paged_kv_cache.0", "input.paged_kv_cache.1"), ("output.0",),
                      load=fi_load, run=fi_run)
# -------------------------------------------------------------------------------------------------


def test_flashinfer_decode_replays_through_the_workbench_kernels(tmp_path):
    register_adapter("fi_decode", FI_DECODE)  # a name of its own: registering again replaces it
    assert "fi_decode" in REGISTRY.names()
    cap = import_capture("flashinfer", FIX / "pt/candidate", tmp_path / "c")
    ds = replay(cap, op="fi_decode", policies={"fp32": Policy(), "fp16 P": Policy(prob_dtype="fp16")})
    assert ds.attrs["n_cases"] == 6  # 2 layers x 3 steps
    # the control's layer-0 output is what fp32 attention gives (fp64 in the engine): ~1e-7
    fp32 = ds.err_captured.sel(variant="fp32")
    layer1 = (ds.layer == 1).to_numpy()
    assert float(fp32[~layer1].max()) < 1e-6
    # the candidate wrote layer 1's output in bf16: the captured output is 1e-3 off FP64, every
    # workbench variant is closer to FP64 than it (the fault is in the captured op, not its inputs)
    assert float(ds.captured_err_oracle[layer1].min()) > 5e-4
    assert int(ds.closer.sel(variant="fp32")[layer1].sum()) == int(layer1.sum())
    # fp16 probabilities move the replay away from FP64 by more than fp32 does
    assert float(ds.err_oracle.sel(variant="fp16 P").mean()) > float(ds.err_oracle.sel(variant="fp32").mean())
