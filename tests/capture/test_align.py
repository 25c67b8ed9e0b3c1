"""Token alignment: chunked against unchunked prefill, a request alone against the same request in
a batch, compared row by row of (request, position)."""

import pytest
import torch

from workbench.analysis import compare_captures
from workbench.capture import CaptureWriter
from workbench.capture.align import prompt_id
from workbench.cli import main
from workbench.errors import AnalysisError
from workbench.kernels import gdn

T = 128
g = torch.Generator().manual_seed(0)
Q, K, V = (torch.randn(1, T + 2, n, 16, generator=g) for n in (1, 1, 2))
G, BETA = -0.05 * torch.rand(1, T + 2, 2, generator=g), torch.rand(1, T + 2, 2, generator=g)
W = torch.randn(50, 32, generator=g)
RID = prompt_id(range(T))


def _gdn_run(path, chunks, *, fault_step=None, batch=True):
    """A GDN layer's prefill in ``chunks`` then 2 decode steps; core output per token, logits of the
    last position of each step."""
    with CaptureWriter(path, arm=path.name) as w:
        s, a = None, 0
        for step, n in enumerate(chunks + [1, 1]):
            x = [t[:, a:a + n] for t in (Q, K, V, G, BETA)]
            fn = gdn.chunked if n > 1 else gdn.recurrent
            o, s = fn(*x, initial_state=s, qk_l2norm=True)
            if step == fault_step:  # a 1% error in that step's output
                o = o * 1.01
            if batch:
                w.add_batch(step, requests=[RID] * n, positions=range(a, a + n))
            w.add(o[0], step=step, layer=0, op="gdn", name="core", dims="t hv v")
            w.add(o[0, -1:].reshape(1, -1) @ W.T, step=step, layer=-1, op="lm_head", name="logits")
            a += n
    return path


def test_chunked_prefill_against_unchunked(tmp_path):
    ctl, cand = _gdn_run(tmp_path / "unchunked", [T]), _gdn_run(tmp_path / "chunked", [64, 64])
    res = compare_captures(ctl, cand)
    assert res.align == "tokens" and res.first_divergence() is None and res.same_keys
    assert float(res.table["rel_l2"].max()) < 1e-5
    assert res.table.set_index(["step", "op"]).loc[(0, "gdn"), "shape_candidate"] == [T, 2, 16]
    assert "1 candidate tensor(s) hold no row the control asks for" in res.align_notes[0]  # chunk 1's logits
    steps = compare_captures(ctl, cand, align="steps")  # step with step: a false divergence
    assert steps.first_divergence()["status"] == "shape_mismatch"
    bad = compare_captures(ctl, _gdn_run(tmp_path / "bad", [64, 64], fault_step=1))
    fd = bad.first_divergence()
    assert (fd["step"], fd["layer"], fd["op"]) == (0, 0, "gdn")  # the control's step holding chunk 2's rows


def test_a_request_alone_against_the_same_request_in_a_batch(tmp_path):
    emb = torch.randn(100, 8, generator=torch.Generator().manual_seed(1))
    prompts = {"a": [5, 7, 9, 11], "b": [1, 2, 3]}

    def write(path, reqs):
        with CaptureWriter(path, arm=path.name) as w:
            rows = [(r, i, t) for r in reqs for i, t in enumerate(prompts[r])]
            w.add_batch(0, requests=[prompt_id(prompts[r]) for r, _, _ in rows], positions=[i for _, i, _ in rows])
            h = emb[[t for _, _, t in rows]]
            w.add(h, step=0, layer=0, op="embed", name="output")
            last = [max(j for j, (r2, _, _) in enumerate(rows) if r2 == r) for r in reqs]
            # fp64 products: the same bits whatever the batch (BLAS picks its kernel by shape)
            w.add((h[last].double() @ emb.T.double()).float(), step=0, layer=-1, op="lm_head", name="logits")
        return path

    alone, batched = write(tmp_path / "alone", ["a"]), write(tmp_path / "batched", ["b", "a"])
    res = compare_captures(alone, batched)
    assert res.first_divergence() is None and len(res.table) == 2
    assert list(res.table["shape_candidate"]) == [[4, 8], [1, 100]]
    assert float(res.table["max_abs"].max()) == 0.0


def test_alignment_needs_batch_rows(tmp_path):
    ctl = _gdn_run(tmp_path / "u", [T])
    cand = _gdn_run(tmp_path / "c", [64, 64], batch=False)
    assert compare_captures(ctl, cand).align == "steps"  # auto: not every capture records its rows
    with pytest.raises(AnalysisError, match="has no batch/request and batch/positions"):
        compare_captures(ctl, cand, align="tokens")
    assert main(["compare", str(ctl), str(cand), "--align", "tokens"]) == 2
    assert main(["compare", str(ctl), str(_gdn_run(tmp_path / "c2", [64, 64])), "--align", "tokens"]) == 0
