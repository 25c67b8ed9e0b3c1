import pytest
import torch

import workbench
from workbench.kernels import _native
from workbench.kernels.gemm import oracle, splitk_matmul
from workbench.numerics import ulp_of

pytestmark = pytest.mark.skipif(_native.find_cxx() is None, reason="no C++ compiler")

def _bound(x, w, S, part):
    """Stated bound on |backend - oracle with partial rounding emulated|: one ulp of the partial
    format per slice (fp32 accumulation can cross a rounding boundary) plus the worst-case fp32
    summation error, (K/S + S) * 2^-24 * sum_k |x_k w_k|."""
    ulps = torch.as_tensor(ulp_of(oracle.splitk_partials(x, w, splits=S), part)).sum(0)
    mag = x.double().abs() @ w.double().abs().T
    return ulps + (x.shape[1] / S + S) * 2.0 ** -24 * mag



def _xw(M, N, K, dtype=torch.bfloat16, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(M, K, generator=g).to(dtype).to(device),
            (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype).to(device))


CASES = [(1, 128, 4096, 1, "fp32", "sequential"), (4, 128, 4096, 9, "bf16", "sequential"),
         (5, 64, 4096, 16, "bf16", "tree"), (3, 64, 1000, 7, "fp16", "tree")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"M{c[0]}-N{c[1]}-K{c[2]}-S{c[3]}-{c[4]}part-{c[5]}")
def test_cpu_build_matches_oracle(case):
    M, N, K, S, part, order = case
    x, w = _xw(M, N, K)
    y = splitk_matmul(x, w, splits=S, partial_dtype=part, order=order, out_dtype="fp32", backend="ext")
    ref = splitk_matmul(x, w, splits=S, partial_dtype=part, order=order, backend="oracle")
    bound = _bound(x, w, S, part)
    assert bool((bound >= (y.double() - ref).abs()).all())
    assert workbench.compare(ref, y).rel_l2 < (1e-6 if part == "fp32" else 1e-3)
    yb = splitk_matmul(x, w, splits=S, partial_dtype=part, order=order, backend="ext")
    assert yb.dtype == torch.bfloat16 and torch.equal(yb, y.bfloat16())


@pytest.mark.skipif(_native.find_nvcc() is None, reason="nvcc not installed")
def test_cuda_source_compiles_with_nvcc():
    path = _native.build("gemm", ["gemm/gemm_cuda.cu"], kind="cuda", headers=["gemm/gemm_elem.h", "qsa/qsa_elem.h"])
    assert path.exists()


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
    y = splitk_matmul(x, w, splits=9, partial_dtype=part, out_dtype="fp32", backend="ext").cpu()
    cols = torch.arange(0, 151936, 37)  # the fp64 oracle on a subset of columns, to stay quick
    ref = splitk_matmul(x.cpu(), w[cols.cuda()].cpu(), splits=9, partial_dtype=part, backend="oracle")
    assert workbench.compare(ref, y[:, cols]).rel_l2 < (1e-6 if part == "fp32" else 1e-3)
