import math

import pytest
import torch

import workbench
from workbench.kernels import qsa
from workbench.kernels.qsa import oracle, torch_ref
from workbench.kernels.qsa.problems import decode_problem
from workbench.numerics import Policy


def test_merge_of_split_outputs_equals_unsplit():
    pb = decode_problem(B=2, HQ=8, HKV=2, D=64, seqlen=900, budget=512, dtype=torch.float32)
    args = (pb.q, pb.cache, pb.cache.block_table, pb.indices)
    o_parts, lse_parts = torch_ref.split_partials(*args, num_splits=5, policy=Policy())
    assert o_parts.shape == (2, 8, 5, 64)
    o, lse = oracle.merge_states(o_parts, lse_parts)
    o1, lse1 = torch_ref.split_partials(*args, num_splits=1, policy=Policy())
    assert workbench.compare(o1[:, :, 0], o).rel_l2 < 1e-6
    assert workbench.compare(lse1[:, :, 0], lse).rel_l2 < 1e-7


def test_partition_size_knob_sets_the_splits():
    pb = decode_problem(B=1, HQ=4, HKV=1, D=32, seqlen=300, budget=128, dtype=torch.float32)
    parts, _ = torch_ref.split_partials(pb.q, pb.cache, pb.cache.block_table, pb.indices,
                                        policy=Policy(partition_size=32))
    assert parts.shape[2] == math.ceil(pb.indices.shape[1] / 32)


def test_below_budget_equals_dense_causal_attention():
    B, HQ, HKV, D, T = 2, 6, 2, 32, 37
    pb = decode_problem(B=B, HQ=HQ, HKV=HKV, D=D, seqlen=T, budget=64, dtype=torch.float32)
    assert pb.indices[:, :T].tolist() == [list(range(T))] * B
    o, lse = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, num_splits=3)
    k, v = pb.cache.dense()
    ref = torch.nn.functional.scaled_dot_product_attention(
        pb.q.double()[:, :, None], k[:, :T].double().transpose(1, 2), v[:, :T].double().transpose(1, 2),
        enable_gqa=True)[:, :, 0]
    assert workbench.compare(ref, o).rel_l2 < 1e-6


def test_duplicates_count_twice():
    pb = decode_problem(B=1, HQ=2, HKV=1, D=16, seqlen=12, budget=64, dtype=torch.float32)
    idx = torch.tensor([[1, 5, 5, -1, 7]], dtype=torch.int32)
    o, _ = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, idx, num_splits=2)
    k, v = pb.cache.dense()
    rows = [1, 5, 5, 7]
    p = torch.softmax(pb.q[0].double() @ k[0, rows, 0].double().T / 4.0, -1)
    assert workbench.compare(p @ v[0, rows, 0].double(), o[0]).rel_l2 < 1e-6
    single, _ = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, torch.tensor([[1, 5, 7]], dtype=torch.int32))
    assert workbench.compare(single, o).rel_l2 > 1e-3


def test_empty_selection_gives_zero_and_minus_inf():
    pb = decode_problem(B=2, HQ=4, HKV=2, D=16, seqlen=20, budget=16, dtype=torch.float32)
    idx = pb.indices.clone()
    idx[1] = -1
    o, lse = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, idx, num_splits=4)
    assert torch.equal(o[1], torch.zeros_like(o[1])) and bool((lse[1] == -math.inf).all())
    assert bool(torch.isfinite(lse[0]).all())


@pytest.mark.parametrize("backend", ["torch", "ext"])
def test_relocation_logical_bit_identical_physical_changes(backend):
    pb = decode_problem(B=2, HQ=8, HKV=2, D=64, seqlen=1200, budget=512, dtype=torch.bfloat16)
    moved = pb.cache.relocate(seed=7)
    out = {}
    for order in ("logical", "physical"):
        pol = Policy(page_order=order, num_kv_splits=4)
        a = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, policy=pol, backend=backend)[0]
        b = qsa.sparse_decode(pb.q, moved, moved.block_table, pb.indices, policy=pol, backend=backend)[0]
        out[order] = (a, b)
    assert torch.equal(*out["logical"])
    assert not torch.equal(*out["physical"])
    ref = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, backend="oracle")[0]
    assert workbench.compare(ref, out["physical"][1]).rel_l2 < 1e-5  # a different order, not a wrong answer


def test_fp16_probabilities_move_the_output_by_fp16_rounding():
    pb = decode_problem(B=2, HQ=8, HKV=2, D=64, seqlen=1500, budget=1024, dtype=torch.bfloat16)
    args = (pb.q, pb.cache, pb.cache.block_table, pb.indices)
    o32 = qsa.sparse_decode(*args, policy=Policy(prob_dtype="fp32"))[0]
    o16 = qsa.sparse_decode(*args, policy=Policy(prob_dtype="fp16"))[0]
    d = workbench.compare(o32, o16).rel_l2
    assert 1e-6 < d < 2 ** -10


@pytest.mark.parametrize("round_first", [True, False], ids=["round-then-gate", "gate-fp32"])
def test_output_gate(round_first):
    g = torch.Generator().manual_seed(0)
    o = torch.randn(2, 4, 32, generator=g)
    gate = torch.randn(2, 4, 32, generator=g).bfloat16()
    y = qsa.output_gate(o, gate, policy=Policy(gate_round_output=round_first))
    assert y.dtype == torch.bfloat16
    x = o.bfloat16().float() if round_first else o
    assert torch.equal(y, (x * torch.sigmoid(gate.float())).bfloat16())
    ref = oracle.output_gate(o, gate)
    assert workbench.compare(ref, y).rel_l2 < 2 ** -7


def test_indexer_ops_match_oracle():
    g = torch.Generator().manual_seed(0)
    k = torch.randn(2, 64, 32, generator=g).bfloat16()
    qi = torch.randn(2, 4, 32, generator=g).bfloat16()
    kb = qsa.block_keys(k)
    assert kb.dtype == torch.float32
    assert workbench.compare(oracle.block_keys(k), kb).rel_l2 < 1e-6
    s = qsa.index_scores(qi, kb, pos=torch.tensor([40, 63]))
    r = oracle.index_scores(qi, oracle.block_keys(k), pos=torch.tensor([40, 63]))
    assert torch.equal(torch.isinf(s), torch.isinf(r))
    fin = torch.isfinite(r)
    assert workbench.compare(r[fin], s[fin]).rel_l2 < 1e-6
