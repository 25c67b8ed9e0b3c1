"""Trajectory noise: per-token NLL deltas on fixed text against the A/A repeat, output churn, and
the three sources (arrays, captures, a model: the hybrid decoder or a Hugging Face causal LM)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings, strategies as st

from workbench.analysis.trajectory import (
    describe_trajectory_noise, hf_arm, output_churn, score_hf, score_trajectories, trajectory_nll,
    trajectory_nll_captures, trajectory_source,
)
from workbench.errors import KernelArgumentError


def test_hand_derived_deltas():
    # two trajectories; the second has one token fewer (NaN-padded)
    ctl = [[1.0, 2.0, 3.0], [0.5, 0.25]]
    rep = [[1.5, 2.0, 2.0], [0.5, 0.75]]
    cand = [[1.25, 2.5, 3.0], [0.25, 0.25]]
    ds = trajectory_nll(ctl, rep, cand)
    # first token: A/A |0.5|, |0| -> 0.25; A/B |0.25|, |-0.25| -> 0.25
    assert ds.first_token_mean_abs.values.tolist() == [0.25, 0.25]
    # all tokens: A/A deltas 0.5, 0, -1, 0, 0.5 -> mean 0; A/B 0.25, 0.5, 0, -0.25, 0 -> mean 0.1
    assert ds.mean_delta.values == pytest.approx([0.0, 0.1])
    assert ds.mean_abs_delta.values == pytest.approx([2.0 / 5, 1.0 / 5])
    assert ds.n_tokens.values.tolist() == [5, 5] and ds.identical_tokens.values.tolist() == [2, 2]
    # per token: candidate larger at positions (0,1), (1,0); repeat larger at (0,0), (0,2), (1,1)
    assert (int(ds.tokens_candidate_larger), int(ds.tokens_repeat_larger)) == (2, 3)
    assert bool(ds.within_noise)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(1, 9), st.floats(0.0, 2.0), st.integers(0, 2**31 - 1))
def test_deltas_and_sign_tests_match_an_independent_computation(n, L, scale, seed):
    rng = np.random.default_rng(seed)
    a = rng.random((n, L)) * 5
    r = a + rng.normal(0, 1e-3, (n, L)) * (rng.random((n, L)) < 0.7)
    c = a + rng.normal(0, 1e-3 * (1 + scale * 10), (n, L))
    ds = trajectory_nll(a, r, c)
    for k, other in enumerate((r, c)):
        d = other - a
        assert float(ds.first_token_mean_abs[k]) == pytest.approx(np.abs(d[:, 0]).mean())
        assert float(ds.mean_delta[k]) == pytest.approx(d.mean())
        assert float(ds.mean_abs_delta[k]) == pytest.approx(np.abs(d).mean())
    bc = int((np.abs(c - a) > np.abs(r - a)).sum())
    br = int((np.abs(r - a) > np.abs(c - a)).sum())
    assert (int(ds.tokens_candidate_larger), int(ds.tokens_repeat_larger)) == (bc, br)
    expect = 1.0 if bc + br == 0 else scipy.stats.binomtest(bc, bc + br).pvalue
    assert float(ds.sign_p_tokens) == pytest.approx(expect, rel=1e-9)
    beyond = np.abs(c - a).mean() > np.abs(r - a).mean() and expect < 0.05
    assert bool(ds.within_noise) == (not beyond)


def test_bad_inputs_are_typed():
    with pytest.raises(KernelArgumentError, match="different numbers of trajectories"):
        trajectory_nll([[1.0]], [[1.0], [2.0]], [[1.0]])
    with pytest.raises(KernelArgumentError, match="first token"):
        trajectory_nll([[np.nan, 1.0]], [[1.0, 1.0]], [[1.0, 1.0]])
    with pytest.raises(KernelArgumentError, match="same prompts"):
        output_churn([[1]], [[1], [2]])


def test_output_churn_counts_outputs_and_first_tokens():
    c = output_churn([[1, 2, 3], [4, 5], [6], [7, 8]], [[1, 2, 3], [4, 9], [0], [7, 8, 9]])
    assert c == {"n": 4, "outputs_changed": 3, "first_tokens_changed": 1, "first_difference": [None, 1, 0, 2]}


def test_captures_source_on_the_bundled_runs():
    ds, info = trajectory_nll_captures("captures/control", "captures/control-repeat", "captures/candidate-bf16-state")
    from workbench.capture import open_capture

    ctl, rep = open_capture("captures/control"), open_capture("captures/control-repeat")
    s = info["steps"][5]
    tok = int(ctl.get(rank=0, step=s, layer=-1, op="sampler", name="token").reshape(-1)[-1])
    assert tok == info["tokens"][5]
    nll = [-torch.log_softmax(c.get(rank=0, step=s, layer=-1, op="lm_head", name="logits").double().reshape(-1), -1)[tok]
           for c in (ctl, rep)]
    assert float(ds.delta.sel(comparison="A/A").values[0, 5]) == float(nll[1] - nll[0])
    # the bf16 GDN state moves the likelihood far more than fp32 reassociation does
    assert float(ds.mean_abs_delta[1]) > 100 * float(ds.mean_abs_delta[0]) and not bool(ds.within_noise)
    assert "beyond the control's own noise" in describe_trajectory_noise(ds)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from transformers import LlamaConfig

    d = tmp_path_factory.mktemp("llama")
    LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=64).save_pretrained(d)
    return d


def test_score_hf_equals_the_models_own_loss(tiny_llama):
    model, _, prompts, _ = trajectory_source(f"hf:{tiny_llama}", candidate="model.layers.0.mlp.down_proj", n_prompts=1,
                                             prompt_len=6)
    cont = [5, 17, 99, 3]
    nll = score_hf(model, prompts[0], cont)
    ids = torch.cat([prompts[0], torch.tensor(cont)])[None]
    labels = ids.clone()
    labels[:, :len(prompts[0])] = -100  # only the continuation is scored
    with torch.no_grad():
        loss = model(ids, labels=labels).loss  # transformers' own shifted cross entropy, fp32
    assert float(np.mean(nll)) == pytest.approx(float(loss), rel=1e-5)


def test_hf_arm_repeat_is_reassociation_and_is_undone(tiny_llama):
    model, _, prompts, _ = trajectory_source(f"hf:{tiny_llama}", candidate="model.layers.1.self_attn.o_proj",
                                             n_prompts=1, prompt_len=8)
    ids = prompts[0][None]
    with torch.no_grad():
        base = model(ids).logits
        with hf_arm(model, splitk=2):
            rep = model(ids).logits
        with hf_arm(model, bf16=["model.layers.1.self_attn.o_proj"]):
            b16 = model(ids).logits
        after = model(ids).logits
    assert torch.equal(base, after)  # forward methods restored
    d_rep, d_b16 = (rep - base).abs().max().item(), (b16 - base).abs().max().item()
    assert 0 < d_rep < 1e-4 and d_b16 > 10 * d_rep
    with pytest.raises(KernelArgumentError, match="no module"):
        with hf_arm(model, bf16=["model.layers.9.mlp"]):
            pass


def test_model_source_hf_finds_a_bf16_module_beyond_the_noise(tiny_llama):
    src, arms, prompts, desc = trajectory_source(f"hf:{tiny_llama}", candidate="model.layers.1.self_attn.o_proj",
                                                 n_prompts=6, prompt_len=8)
    ds, info = score_trajectories(src, prompts, arms, steps=5)
    assert ds.sizes == {"arm": 3, "comparison": 2, "trajectory": 6, "position": 5}
    assert not bool(ds.within_noise) and float(ds.mean_abs_delta[1]) > float(ds.mean_abs_delta[0])
    assert info["churn_repeat"]["n"] == 6 and len(info["outputs"]["candidate"][0]) == 5
    # the control scored on its own output: its NLL is that of its greedy tokens
    assert np.isfinite(ds.nll.values).all()


def test_model_source_hybrid_scores_what_generate_samples(tmp_path):
    from workbench.capture import CaptureWriter, open_capture
    from workbench.models.hybrid import ArmConfig, RecordSpec

    src, arms, prompts, desc = trajectory_source("hybrid", candidate="gdn.state_dtype:bf16", n_prompts=1, prompt_len=8)
    assert "gdn state_dtype=bf16" in desc and arms["repeat"].proj.splitk == 2
    with CaptureWriter(tmp_path / "c", arm="control") as w:
        out = src.generate(prompts[0], steps=2, arm=arms["control"], writer=w, spec=RecordSpec())
    cap = open_capture(tmp_path / "c")
    nll = src.score(prompts[0], out, arm=arms["control"])
    for s, tok in enumerate(out):  # teacher-forced on its own greedy output = the logits generate() recorded
        lg = cap.get(rank=0, step=s, layer=-1, op="lm_head", name="logits").double().reshape(-1)
        assert nll[s] == float(-torch.log_softmax(lg, -1)[tok])
    with pytest.raises(KernelArgumentError, match="family.knob:value"):
        trajectory_source("hybrid", candidate="state_dtype:bf16")
    with pytest.raises(KernelArgumentError, match="unknown model"):
        trajectory_source("llama", candidate="x")
