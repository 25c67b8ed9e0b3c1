import math

import pytest
import torch

from workbench.kernels.qsa import oracle
from workbench.kernels.qsa.paged import PagedKVCache

INF = float("inf")


def test_merge_states_contract():
    o = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [9.0, 9.0]]])
    lse = torch.tensor([[1.0, 0.0, -INF]])
    om, lm = oracle.merge_states(o, lse)
    w = torch.tensor([2.0, 1.0]) / 3  # 2^1 : 2^0, the empty part adds nothing
    assert torch.allclose(om[0], (w[:, None] * o[0, :2].double()).sum(0))
    assert lm.item() == pytest.approx(math.log2(3.0))


def test_merge_states_all_empty_gives_zero_and_minus_inf():
    om, lm = oracle.merge_states(torch.zeros(2, 3, 4), torch.full((2, 3), -INF))
    assert torch.equal(om, torch.zeros(2, 4, dtype=torch.float64)) and bool((lm == -INF).all())


def test_sparse_decode_is_a_softmax_over_the_listed_tokens():
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(1, 8, 1, 4, generator=g), torch.randn(1, 8, 1, 4, generator=g)
    q = torch.randn(1, 2, 4, generator=g)
    c = PagedKVCache.from_dense(k, v, seed=1)
    idx = torch.tensor([[3, 0, 3, -1]], dtype=torch.int32)  # token 3 listed twice
    o, lse = oracle.sparse_decode(q, c, c.block_table, idx)
    rows = [3, 0, 3]
    s = torch.einsum("hd,ld->hl", q[0].double(), k[0, rows, 0].double()) * 0.5
    p = torch.softmax(s, -1)
    assert torch.allclose(o[0], p @ v[0, rows, 0].double())
    assert torch.allclose(lse[0], torch.logsumexp(s, -1) / math.log(2))


def test_select_rules():
    scores = torch.tensor([[1.0, 5.0, 5.0, 2.0, 7.0, -INF]])
    # pos 21: blocks 0..4 complete (5 visible), budget 8 / ratio 4 = 2 blocks: 4 then 1 (tie 1 vs 2 -> lower)
    idx = oracle.select(scores, budget=8, ratio=4, pos=21)
    assert idx.tolist() == [[16, 17, 18, 19, 4, 5, 6, 7, 20, 21, -1]]
    idx = oracle.select(scores, budget=8, ratio=4, pos=21, order="logical")
    assert idx.tolist() == [[4, 5, 6, 7, 16, 17, 18, 19, 20, 21, -1]]
    # tokens past the stored sequence are dropped, then padded
    idx = oracle.select(scores, budget=8, ratio=4, pos=21, seqlen=18)
    assert idx.tolist() == [[16, 17, 4, 5, 6, 7] + [-1] * 5]
    # below the budget: the whole causal prefix, in order
    assert oracle.select(scores, budget=8, ratio=4, pos=6).tolist() == [[0, 1, 2, 3, 4, 5, 6, -1, -1, -1, -1]]


def test_index_scores_hide_blocks_not_complete():
    qi = torch.tensor([[[1.0, 0.0], [-1.0, 0.0]]])
    kb = torch.tensor([[[2.0, 0.0], [-3.0, 0.0], [1.0, 1.0]]])
    s = oracle.index_scores(qi, kb, pos=7, ratio=4)
    assert s.tolist() == [[2 / math.sqrt(2), 3 / math.sqrt(2), -INF]]


def test_block_keys_mean_and_norm_hook():
    k = torch.arange(24.0).reshape(1, 6, 4)
    kb = oracle.block_keys(k, ratio=2)
    assert kb.shape == (1, 3, 4) and kb[0, 0].tolist() == [2.0, 3.0, 4.0, 5.0]
    kn = oracle.block_keys(k, ratio=2, norm=lambda x: x / x.norm(dim=-1, keepdim=True))
    assert torch.allclose(kn.norm(dim=-1), torch.ones(1, 3, dtype=torch.float64))
