import pytest
import torch

import workbench
from workbench.kernels.gemm import splitk_matmul


@pytest.mark.parametrize("args", [(3, 10, 70, 3, "bf16", "tree", "bf16"), (17, 3, 40, 4, "fp32", "sequential", "fp16")],
                         ids=["M3-N10-K70-S3-bf16part-tree", "M17-N3-K40-S4-fp32part-seq-fp16"])
def test_simulator_tiny_grid_matches_oracle(cudasim, args):
    r = cudasim("workbench.kernels.gemm.numba_cuda:selfcheck", *args)
    assert r["rel_emulated"] < 1e-6  # reproduces the oracle with the partial rounding emulated


def test_every_kernel_signature_compiles_to_ptx_for_sm90():
    cuda = pytest.importorskip("numba.cuda")
    from workbench.kernels.gemm.numba_cuda import SIGNATURES
    for name, kernel, sig in SIGNATURES:
        ptx, _ = cuda.compile_ptx(kernel.py_func, sig, cc=(9, 0))
        assert ".target sm_90" in ptx and name in ptx


@pytest.fixture(scope="module")
def lm_head():
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(20, 4096, device="cuda", generator=g).bfloat16()
    w = (torch.randn(151936, 4096, device="cuda", generator=g) / 64).bfloat16()
    return x, w


@pytest.mark.gpu
@pytest.mark.parametrize("M", [1, 16, 20], ids=lambda m: f"M{m}-N151936-K4096")
@pytest.mark.parametrize("part", ["fp32", "bf16"], ids=lambda p: f"{p}part")
def test_gpu_matches_oracle_at_lm_head_shape(lm_head, M, part):
    x, w = lm_head[0][:M], lm_head[1]
    y = splitk_matmul(x, w, splits=9, partial_dtype=part, out_dtype="fp32", backend="numba").cpu()
    cols = torch.arange(0, 151936, 37)  # the fp64 oracle on a subset of columns, to stay quick
    ref = splitk_matmul(x.cpu(), w[cols.cuda()].cpu(), splits=9, partial_dtype=part, backend="oracle")
    assert workbench.compare(ref, y[:, cols]).rel_l2 < (1e-6 if part == "fp32" else 1e-3)
