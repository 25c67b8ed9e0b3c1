import pytest
import torch

import workbench
from workbench.kernels import _native
from workbench.errors import PolicyError
from workbench.kernels.gemm import batch_invariance, ext, oracle, splitk_matmul
from workbench.numerics import ulp_of

pytestmark = pytest.mark.skipif(_native.find_cxx() is None, reason="no C++ compiler")

def _bound(x, w, S, part, tensor_cores=False):
    """Stated bound on |backend - oracle with partial rounding emulated|: one ulp of the partial
    format per slice (fp32 accumulation can cross a rounding boundary) plus the worst-case fp32
    summation error, (K/S + S) * 2^-24 * sum_k |x_k w_k|.

    The CUDA tensor-core path (``tensor_cores``) sums each block of 16 exact products inside the
    mma, in an order and with a rounding the hardware defines (the products are aligned to the
    largest one and truncated, not rounded to nearest), before the block sums are added in fp32
    round-to-nearest. Allowing up to one fp32 ulp (2^-23 relative) of truncation per product and
    one for the block's normalization gives at most 17 * 2^-23 = 34 * 2^-24 times the block's
    sum |x_k w_k|, so the bound gains 34 * 2^-24 * sum_k |x_k w_k|; the fp32 additions of the
    block sums are fewer than K/S and stay covered by the first term."""
    ulps = torch.as_tensor(ulp_of(oracle.splitk_partials(x, w, splits=S), part)).sum(0)
    mag = x.double().abs() @ w.double().abs().T
    return ulps + (x.shape[1] / S + S + (34 if tensor_cores else 0)) * 2.0 ** -24 * mag



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


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"M{c[0]}-N{c[1]}-K{c[2]}-S{c[3]}-{c[4]}part-{c[5]}")
def test_cpu_build_equals_torch_backend_bitwise(case):
    # two implementations of one arithmetic (each slice summed in fp32 in k order, no FMA, the
    # partial rounded once, the partials reduced in the stated order): every bit agrees
    M, N, K, S, part, order = case
    x, w = _xw(M, N, K)
    kw = dict(splits=S, partial_dtype=part, order=order, out_dtype="fp32")
    assert torch.equal(splitk_matmul(x, w, backend="ext", **kw), splitk_matmul(x, w, backend="torch", **kw))


@pytest.mark.skipif(_native.find_nvcc() is None, reason="nvcc not installed")
def test_cuda_source_compiles_with_nvcc():
    path = _native.build("gemm", ["gemm/gemm_cuda.cu"], kind="cuda", headers=["gemm/gemm_elem.h", "qsa/qsa_elem.h"])
    assert path.exists()


@pytest.mark.parametrize("env, dtype, want", [
    (None, torch.bfloat16, "mma"), (None, torch.float16, "mma"), (None, torch.float32, "scalar"),
    ("scalar", torch.bfloat16, "scalar"), ("mma", torch.float16, "mma"), ("AUTO", torch.bfloat16, "mma"),
])
def test_cuda_path_choice(monkeypatch, env, dtype, want):
    if env is None:
        monkeypatch.delenv(ext.PATH_ENV, raising=False)
    else:
        monkeypatch.setenv(ext.PATH_ENV, env)
    assert ext.cuda_path(dtype) == want


@pytest.mark.parametrize("env, dtype", [("mma", torch.float32), ("wgmma", torch.bfloat16)])
def test_cuda_path_bad_choice(monkeypatch, env, dtype):
    monkeypatch.setenv(ext.PATH_ENV, env)
    with pytest.raises(PolicyError) as e:
        ext.cuda_path(dtype)
    assert ext.PATH_ENV in str(e.value) and e.value.key == "cuda_path"


def test_cuda_path_is_a_policy_knob_the_environment_only_defaults(monkeypatch):
    monkeypatch.setenv(ext.PATH_ENV, "scalar")
    assert ext.cuda_path(torch.bfloat16) == "scalar"                  # replaces the default 'auto'
    assert ext.cuda_path(torch.bfloat16, "mma") == "mma"              # an explicit knob wins
    monkeypatch.delenv(ext.PATH_ENV)
    assert ext.cuda_path(torch.bfloat16) == "mma" and ext.cuda_path(torch.float32) == "scalar"
    with pytest.raises(PolicyError, match="policy.cuda_path='mma'"):
        ext.cuda_path(torch.float32, "mma")
    x, w = torch.randn(2, 32), torch.randn(4, 32)
    with pytest.raises(PolicyError, match="gemm backend 'torch' does not honour policy.cuda_path='scalar'"):
        splitk_matmul(x, w, splits=2, policy={"cuda_path": "scalar"})
    with pytest.raises(PolicyError, match=r"splitk=65 \(it honours 1..64\)"):
        splitk_matmul(torch.randn(2, 130), torch.randn(4, 130), splits=65, backend="ext")
    from workbench.kernels.registry import kernel_log
    with kernel_log() as log:  # the path a call took is recorded with it
        splitk_matmul(x, w, splits=2, backend="ext")
    (row,) = log.summary()
    assert (row["backend"], row["ran"], row["path"], row["calls"]) == ("ext", "ext", "cpu", 1)


# (M, N, K, S, partial, order, input dtype): N not a multiple of the 32-column block, M on both
# sides of the 8-token mma tile, K and slice lengths that are not multiples of 8 (element loads),
# slices shorter than one block iteration, fp16 inputs; fp32 inputs run on CUDA cores
GPU_CASES = [(1, 1000, 4096, 1, "fp32", "sequential", torch.bfloat16),
             (5, 256, 4096, 9, "bf16", "sequential", torch.bfloat16),
             (12, 130, 4096, 16, "fp32", "tree", torch.bfloat16),
             (16, 64, 1000, 7, "fp16", "tree", torch.float16),
             (3, 64, 1003, 5, "fp32", "sequential", torch.float16),
             (7, 96, 4096, 64, "fp32", "tree", torch.bfloat16),
             (9, 64, 200, 3, "fp32", "sequential", torch.bfloat16),
             (2, 64, 4096, 4, "fp32", "sequential", torch.float32)]


@pytest.mark.gpu
@pytest.mark.parametrize("path", ["auto", "scalar"])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: f"M{c[0]}-N{c[1]}-K{c[2]}-S{c[3]}-{c[4]}part-{c[5]}-"
                                                        f"{str(c[6]).split('.')[-1]}")
def test_gpu_within_bound(monkeypatch, case, path):
    M, N, K, S, part, order, dtype = case
    monkeypatch.setenv(ext.PATH_ENV, path)
    x, w = _xw(M, N, K, dtype=dtype, seed=M + K)
    y = splitk_matmul(x.cuda(), w.cuda(), splits=S, partial_dtype=part, order=order, out_dtype="fp32",
                      backend="ext").cpu()
    ref = splitk_matmul(x, w, splits=S, partial_dtype=part, order=order, backend="oracle")
    bound = _bound(x, w, S, part, tensor_cores=ext.cuda_path(dtype) == "mma")
    err = (y.double() - ref).abs()
    assert bool((bound >= err).all()), float((err / bound).max())
    assert workbench.compare(ref, y).rel_l2 < (1e-6 if part == "fp32" else 1e-3)
    yo = splitk_matmul(x.cuda(), w.cuda(), splits=S, partial_dtype=part, order=order, backend="ext").cpu()
    assert yo.dtype == dtype and torch.equal(yo, y.to(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("S", [1, 9])
def test_gpu_tensor_core_path_is_batch_invariant(S):
    # an mma output column depends on its own token only, and the accumulation order does not
    # depend on M: a row alone and inside a batch of 16 (or 20: two launches) are bitwise equal
    x, w = _xw(20, 512, 4096, seed=S, device="cuda")
    rep = batch_invariance(lambda xx: splitk_matmul(xx, w, splits=S, partial_dtype="fp32", backend="ext"), x)
    assert rep.invariant, str(rep)
