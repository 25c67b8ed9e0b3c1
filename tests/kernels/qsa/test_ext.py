import math

import pytest
import torch

import workbench
from workbench.kernels import _native, qsa
from workbench.kernels.qsa.problems import decode_problem
from workbench.numerics import Policy

pytestmark = pytest.mark.skipif(_native.find_cxx() is None, reason="no C++ compiler")

CASES = [(1, 24, 2, 256, 2600, 2048, 4, "fp32", torch.bfloat16), (3, 24, 2, 128, 900, 512, 3, "fp16", torch.bfloat16),
         (2, 4, 2, 64, 300, 128, 2, "bf16", torch.float16), (2, 4, 1, 32, 100, 64, 5, "fp32", torch.float32)]


def _id(c):
    return f"B{c[0]}-HQ{c[1]}-HKV{c[2]}-D{c[3]}-T{c[4]}-S{c[6]}-{c[7]}prob-{str(c[8])[6:]}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_cpu_build_matches_oracle_and_torch(case):
    B, HQ, HKV, D, T, budget, S, prob, dtype = case
    pb = decode_problem(B=B, HQ=HQ, HKV=HKV, D=D, seqlen=T, budget=budget, dtype=dtype)
    args = (pb.q, pb.cache, pb.cache.block_table, pb.indices)
    pol = Policy(prob_dtype=prob, num_kv_splits=S)
    o, lse = qsa.sparse_decode(*args, policy=pol, backend="ext")
    ro, rlse = qsa.sparse_decode(*args, backend="oracle")
    to, _ = qsa.sparse_decode(*args, policy=pol, backend="torch")
    tol = {"fp32": 2e-6, "fp16": 2e-3, "bf16": 1e-2}[prob]
    assert workbench.compare(ro, o).rel_l2 < tol
    assert workbench.compare(rlse, lse).rel_l2 < 1e-6
    assert workbench.compare(to, o).rel_l2 < tol  # same rounding points, different sum orders


def test_empty_rows_and_merge():
    pb = decode_problem(B=2, HQ=4, HKV=2, D=16, seqlen=40, budget=16, dtype=torch.float32)
    idx = pb.indices.clone()
    idx[0] = -1
    o, lse = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, idx, num_splits=3, backend="ext")
    assert torch.equal(o[0], torch.zeros_like(o[0])) and bool((lse[0] == -math.inf).all())
    parts = torch.randn(2, 3, 4, 8)
    lses = torch.randn(2, 3, 4)
    lses[0, 0] = -math.inf
    lses[1, 2, 1] = -math.inf
    mo, ml = qsa.merge_states(parts, lses, backend="ext")
    ro, rl = qsa.merge_states(parts, lses, backend="oracle")
    assert torch.equal(mo[0, 0], torch.zeros(8)) and ml[0, 0].item() == -math.inf
    assert workbench.compare(ro, mo).rel_l2 < 1e-6 and workbench.compare(rl[1], ml[1]).rel_l2 < 1e-6


@pytest.mark.skipif(_native.find_nvcc() is None, reason="nvcc not installed")
def test_cuda_source_compiles_with_nvcc():
    path = _native.build("qsa", ["qsa/qsa_cuda.cu"], kind="cuda", headers=["qsa/qsa_elem.h"])
    assert path.exists()


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 4, 16], ids=lambda b: f"B{b}-HQ24-HKV2-D256")
@pytest.mark.parametrize("prob", ["fp32", "fp16"], ids=lambda p: f"{p}prob")
@pytest.mark.parametrize("order", ["logical", "physical"])
def test_cuda_matches_oracle_at_real_shapes(B, prob, order):
    pb = decode_problem(B=B, HQ=24, HKV=2, D=256, seqlen=4096, budget=2048)
    pol = Policy(prob_dtype=prob, num_kv_splits=8, page_order=order)
    ro, rlse = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, backend="oracle")
    g = pb.to("cuda")
    o, lse = qsa.sparse_decode(g.q, g.cache, g.cache.block_table, g.indices, policy=pol, backend="ext")
    tol = 2e-6 if prob == "fp32" else 2e-3
    assert workbench.compare(ro, o.cpu()).rel_l2 < tol
    assert workbench.compare(rlse, lse.cpu()).rel_l2 < 1e-6
    moved = g.cache.relocate(seed=3)
    o2, _ = qsa.sparse_decode(g.q, moved, moved.block_table, g.indices, policy=pol, backend="ext")
    assert torch.equal(o, o2) == (order == "logical")
