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


def _sliced_run(path, chunks, keep):
    """As :func:`_gdn_run`, but each prefill step records only the prompt's last ``keep`` rows of
    its per-token output (tag positions="a:b": rows a..b of the step; none for an early chunk)."""
    with CaptureWriter(path, arm=path.name) as w:
        s, a = None, 0
        for step, n in enumerate(chunks + [1, 1]):
            x = [t[:, a:a + n] for t in (Q, K, V, G, BETA)]
            o, s = (gdn.chunked if n > 1 else gdn.recurrent)(*x, initial_state=s, qk_l2norm=True)
            w.add_batch(step, requests=[RID] * n, positions=range(a, a + n))
            lo = max(0, T - keep - a) if step < len(chunks) else 0
            if lo < n:
                w.add(o[0, lo:], step=step, layer=0, op="gdn", name="core", dims="t hv v",
                      **({"positions": f"{lo}:{n}"} if lo else {}))
            w.add(s[0], step=step, layer=0, op="gdn", name="state", dims="hv k v")
            a += n
    return path


def test_rows_kept_by_a_positions_tag_align_by_position(tmp_path):
    """A recorder that keeps the prompt's last 8 rows (tag positions="a:b") in both arms: the
    unchunked step 0 rows 120:128 are the chunked arm's step 1 rows 56:64; the state after the
    prompt pairs with the state after the last chunk; the first chunk's state is listed."""
    one = _sliced_run(tmp_path / "one", [T], keep=8)
    two = _sliced_run(tmp_path / "two", [64, 64], keep=8)
    res = compare_captures(one, two)
    assert res.align == "tokens" and res.first_divergence() is None
    assert set(res.table["status"]) == {"ok"} and len(res.table) == 6  # core + state at 3 steps
    core0 = res.table[(res.table["step"] == 0) & (res.table["name"] == "core")].iloc[0]
    assert list(core0["shape_candidate"]) == [8, 2, 16] and core0["rel_l2"] < 1e-6
    assert any("hold no row the control asks for" in n for n in res.align_notes)  # chunk 0's state
    # the candidate kept other rows than the control asks for: the key is the control's only
    short = _sliced_run(tmp_path / "short", [64, 64], keep=4)
    res = compare_captures(one, short)
    assert res.only_control[["step", "name"]].values.tolist() == [[0, "core"]]


def test_token_agreement_pairs_by_position(tmp_path):
    from workbench.analysis.tokens import token_agreement

    one, two = _gdn_run(tmp_path / "one", [T]), _gdn_run(tmp_path / "two", [64, 64])
    ds = token_agreement(one, two, logits="lm_head/logits")
    assert ds.attrs["pairing"] == "request and position" and ds.attrs["first_differing_step"] == -1
    assert ds.sizes["step"] == 3 and bool(ds["agree"].all())
    steps = token_agreement(one, two, logits="lm_head/logits", align="steps")
    assert steps.attrs["pairing"] == "step" and steps.attrs["first_differing_step"] == 0  # chunk 0 != prompt
    plain = _gdn_run(tmp_path / "plain", [T], batch=False)
    with pytest.raises(AnalysisError, match="no batch rows"):
        token_agreement(one, plain, logits="lm_head/logits", align="tokens")
    assert token_agreement(one, plain, logits="lm_head/logits").attrs["pairing"] == "step"
