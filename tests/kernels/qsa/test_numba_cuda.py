import pytest
import torch

from workbench.kernels import qsa
from workbench.kernels.qsa.problems import decode_problem
from workbench.numerics import Policy

SIM_CASES = [dict(), dict(dtype="bf16", prob="fp16", order="physical", num_splits=2),
             dict(B=2, HQ=6, HKV=3, D=8, seqlen=30, budget=12, num_splits=1, prob="bf16", dtype="fp16")]


@pytest.mark.parametrize("case", SIM_CASES, ids=["B1-HQ4-HKV2-D16-fp32", "B1-HQ4-HKV2-D16-bf16-fp16prob-physical",
                                                 "B2-HQ6-HKV3-D8-fp16-bf16prob"])
def test_simulator_tiny_grid_matches_oracle(cudasim, case):
    r = cudasim("workbench.kernels.qsa.numba_cuda:selfcheck", *[case.get(k, d) for k, d in (
        ("B", 1), ("HQ", 4), ("HKV", 2), ("D", 16), ("seqlen", 24), ("budget", 8), ("num_splits", 3),
        ("prob", "fp32"), ("order", "logical"), ("dtype", "fp32"))])
    tol = {"fp32": 1e-6, "fp16": 2e-3, "bf16": 1e-2}[case.get("prob", "fp32")]
    assert r["o_rel"] < tol and r["lse_rel"] < 1e-6
    assert r["empty_zero"] and r["empty_lse"] == float("-inf")


def test_every_kernel_signature_compiles_to_ptx_for_sm90():
    cuda = pytest.importorskip("numba.cuda")
    from workbench.kernels.qsa.numba_cuda import SIGNATURES
    for name, kernel, sig in SIGNATURES:
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        assert ".target sm_90" in ptx and name in ptx


@pytest.mark.gpu
@pytest.mark.parametrize("B", [1, 8, 16], ids=lambda b: f"B{b}-HQ24-HKV2-D256")
@pytest.mark.parametrize("prob", ["fp32", "fp16"], ids=lambda p: f"{p}prob")
def test_gpu_relocation_is_bit_identical_in_logical_order_only(B, prob):
    # (against the oracle at these shapes: tests/kernels/test_conformance.py)
    pb = decode_problem(B=B, HQ=24, HKV=2, D=256, seqlen=4096, budget=2048)
    g = pb.to("cuda")
    for order in ("logical", "physical"):
        pol = Policy(prob_dtype=prob, num_kv_splits=8, page_order=order)
        o, lse = qsa.sparse_decode(g.q, g.cache, g.cache.block_table, g.indices, policy=pol, backend="numba")
        moved = g.cache.relocate(seed=3)
        o2, _ = qsa.sparse_decode(g.q, moved, moved.block_table, g.indices, policy=pol, backend="numba")
        assert torch.equal(o, o2) == (order == "logical")
