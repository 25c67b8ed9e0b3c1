import math

import pytest
import torch

import workbench
from workbench.errors import BackendUnavailableError, KernelArgumentError
from workbench.kernels import _native, qsa
from workbench.kernels.qsa import ext
from workbench.kernels.qsa.problems import decode_problem
from workbench.numerics import Policy

pytestmark = pytest.mark.skipif(_native.find_cxx() is None, reason="no C++ compiler")


def test_input_and_output_dtypes_around_the_kernel():
    """policy.input_dtype materializes q/k/v before the kernel, policy.output_dtype rounds o after."""
    pb = decode_problem(B=2, HQ=4, HKV=2, D=16, seqlen=40, budget=16, seed=5, dtype=torch.float32)
    cache = (pb.cache.k, pb.cache.v)
    o, lse = ext.sparse_decode(pb.q, cache, pb.cache.block_table, pb.indices, num_splits=2,
                               policy=Policy(input_dtype="bf16", output_dtype="fp16"))
    ro, rlse = ext.sparse_decode(pb.q.bfloat16(), (pb.cache.k.bfloat16(), pb.cache.v.bfloat16()),
                                 pb.cache.block_table, pb.indices, num_splits=2)
    assert o.dtype == torch.float16 and lse.dtype == torch.float32
    assert torch.equal(o, ro.half()) and torch.equal(lse, rlse)
    assert not torch.equal(ro, ext.sparse_decode(pb.q, cache, pb.cache.block_table, pb.indices,
                                                 num_splits=2)[0])   # bf16 inputs did change o


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
def test_cuda_relocation_is_bit_identical_in_logical_order_only(B, prob, order):
    # (against the oracle at these shapes: tests/kernels/test_conformance.py)
    pb = decode_problem(B=B, HQ=24, HKV=2, D=256, seqlen=4096, budget=2048)
    pol = Policy(prob_dtype=prob, num_kv_splits=8, page_order=order)
    g = pb.to("cuda")
    o, lse = qsa.sparse_decode(g.q, g.cache, g.cache.block_table, g.indices, policy=pol, backend="ext")
    moved = g.cache.relocate(seed=3)
    o2, _ = qsa.sparse_decode(g.q, moved, moved.block_table, g.indices, policy=pol, backend="ext")
    assert torch.equal(o, o2) == (order == "logical")


def _gpu_case(pb, pol, **launch):
    g = pb.to("cuda")
    with ext.cuda_launch(**launch):
        return qsa.sparse_decode(g.q, g.cache, g.cache.block_table, g.indices, policy=pol, backend="ext")


def _check(pb, pol, o, lse, tol):
    ro, rlse = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, backend="oracle")
    assert bool(torch.isfinite(o).all())
    assert workbench.compare(ro, o.cpu()).rel_l2 < tol
    assert workbench.compare(rlse, lse.cpu()).rel_l2 < 1e-6


# head dims of the fast kernel x query heads per KV head (G = 12, 1, 16 and 3, padded to 4) x inputs
FAST = [(D, HQ, HKV, dt) for D in (64, 128, 256) for HQ, HKV in ((24, 2), (4, 4), (16, 1), (6, 2))
        for dt in (torch.bfloat16, torch.float16, torch.float32)]


@pytest.mark.gpu
@pytest.mark.parametrize("case", FAST, ids=lambda c: f"D{c[0]}-HQ{c[1]}-HKV{c[2]}-{str(c[3])[6:]}")
def test_cuda_fast_kernel_matches_oracle_generic_and_cpu(case):
    D, HQ, HKV, dt = case
    pb = decode_problem(B=3, HQ=HQ, HKV=HKV, D=D, seqlen=700, budget=256, dtype=dt, seed=D + HQ)
    pol = Policy(num_kv_splits=3)
    o, lse = _gpu_case(pb, pol, kernel="fast")
    _check(pb, pol, o, lse, 2e-6)
    og, _ = _gpu_case(pb, pol, kernel="generic")
    oc, _ = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, policy=pol, backend="ext")
    assert workbench.compare(og.cpu(), o.cpu()).rel_l2 < 1e-6
    assert workbench.compare(oc, o.cpu()).rel_l2 < 1e-6
    o2, lse2 = _gpu_case(pb, pol, kernel="fast")
    assert torch.equal(o, o2) and torch.equal(lse, lse2)  # fixed reduction orders


@pytest.mark.gpu
@pytest.mark.parametrize("prob", ["fp16", "bf16"], ids=lambda p: f"{p}prob")
@pytest.mark.parametrize("D", [128, 256], ids=lambda d: f"B4-HQ24-HKV2-D{d}")
@pytest.mark.parametrize("order", ["logical", "physical"])
def test_cuda_fast_kernel_rounded_probabilities(prob, D, order):
    pb = decode_problem(B=4, HQ=24, HKV=2, D=D, seqlen=3000, budget=1024, seed=7)
    pol = Policy(prob_dtype=prob, num_kv_splits=5, page_order=order)
    o, lse = _gpu_case(pb, pol)
    _check(pb, pol, o, lse, {"fp16": 2e-3, "bf16": 1e-2}[prob])
    # the same rounding points as the sequential C++ build: differences come from sum orders only
    oc, _ = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, policy=pol, backend="ext")
    assert workbench.compare(oc, o.cpu()).rel_l2 < {"fp16": 1e-4, "bf16": 1e-3}[prob]


@pytest.mark.gpu
@pytest.mark.parametrize("warps", [1, 3, 4, 8])
def test_cuda_fast_kernel_any_block_size(warps):
    pb = decode_problem(B=2, HQ=24, HKV=2, D=256, seqlen=2000, budget=512, seed=warps)
    pol = Policy(num_kv_splits=4)
    o, lse = _gpu_case(pb, pol, kernel="fast", warps=warps)
    _check(pb, pol, o, lse, 2e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["fast", "generic"])
def test_cuda_padding_duplicates_and_empty_partitions(kernel):
    pb = decode_problem(B=3, HQ=24, HKV=2, D=128, seqlen=400, budget=96, seed=11)
    idx = pb.indices.clone()
    idx[0, 5:9] = -1                   # padding inside the list
    idx[0, 20:24] = idx[0, 30]         # a token listed five times (20..23 and 30)
    idx[1, :50] = -1                   # whole partitions empty (S=4: P=25)
    idx[2] = -1                        # a row with no token
    idx[2, 40] = 17
    pb.indices = idx
    pol = Policy(num_kv_splits=4)
    o, lse = _gpu_case(pb, pol, kernel=kernel)
    _check(pb, pol, o, lse, 2e-6)
    empty = idx.clone()
    empty[2] = -1
    g = pb.to("cuda")
    with ext.cuda_launch(kernel=kernel):
        oe, le = qsa.sparse_decode(g.q, g.cache, g.cache.block_table, empty.cuda(), policy=pol, backend="ext")
    assert torch.equal(oe[2].cpu(), torch.zeros_like(oe[2].cpu())) and bool((le[2] == -math.inf).all())


@pytest.mark.gpu
def test_cuda_generic_kernel_serves_other_head_dims():
    pb = decode_problem(B=2, HQ=8, HKV=2, D=96, seqlen=500, budget=128, seed=5)
    pol = Policy(num_kv_splits=3)
    o, lse = _gpu_case(pb, pol)
    _check(pb, pol, o, lse, 2e-6)
    with pytest.raises(BackendUnavailableError, match="WB_ERR_SHAPE"):
        _gpu_case(pb, pol, kernel="fast")


@pytest.mark.gpu
def test_cuda_launch_is_graph_capturable():
    pb = decode_problem(B=4, HQ=24, HKV=2, D=256, seqlen=4096, budget=2048, seed=2)
    g = pb.to("cuda")
    pol = Policy(num_kv_splits=8)

    def step():
        return ext.sparse_decode(g.q, g.cache, g.cache.block_table, g.indices, policy=pol)

    ref = step()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


def test_cuda_launch_rejects_bad_overrides():
    with pytest.raises(KernelArgumentError, match="warps"):
        with ext.cuda_launch(warps=9):
            pass
    with pytest.raises(KernelArgumentError, match="kernel"):
        with ext.cuda_launch(kernel="mma"):
            pass


def _rounding_probe() -> torch.Tensor:
    """fp32 values that exercise a rounding: random magnitudes over the whole range, the exact
    halfway points between bf16 and fp16 neighbours (ties go to even), their fp32 neighbours,
    fp16 subnormals, values at the overflow thresholds, signed zeros and infinities."""
    g = torch.Generator().manual_seed(11)
    rnd = torch.randn(20000, generator=g) * torch.exp2(torch.randint(-30, 30, (20000,), generator=g).float())
    bits = torch.randint(0, 2**31 - 1, (20000,), generator=g, dtype=torch.int64).to(torch.int32)
    halves = []
    for drop in (16, 13):  # fraction bits dropped for bf16 and fp16
        mant = torch.randint(0, 2**(23 - drop), (4000,), generator=g, dtype=torch.int32)
        exp = torch.randint(100, 150, (4000,), generator=g, dtype=torch.int32)
        tie = (exp << 23) | (mant << drop) | (1 << (drop - 1))
        halves += [tie, tie + 1, tie - 1]
    special = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, 65536.0, 3.3895e38, 3.4e38, 2.0**-24,
                            2.0**-25, 3 * 2.0**-26, 2.0**-14 - 2.0**-26, 1e-40, -1e-40,
                            float("inf"), -float("inf")])
    tiny = torch.linspace(-2.0**-13, 2.0**-13, 5001)
    parts = [rnd, bits.view(torch.float32)[:5000], *[h.view(torch.float32) for h in halves], special, tiny]
    x = torch.cat(parts)
    return torch.cat([x, -x])


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_native_element_rounding_is_round_to_nearest_even_bitwise(dtype):
    # the rounding point every native QSA and GEMM kernel shares, bit for bit against torch's
    # cast (an independent RNE): truncation, ties away from zero or a wrong subnormal quantum fail
    x = _rounding_probe()
    x = x[torch.isfinite(x) | torch.isinf(x)]
    got = ext.round_elements(x, dtype)
    want = x.to(torch.bfloat16 if dtype == "bf16" else torch.float16).float()
    same = (got.view(torch.int32) == want.view(torch.int32)) | (torch.isnan(got) & torch.isnan(want))
    assert bool(same.all()), f"{int((~same).sum())} of {x.numel()} differ, e.g. {x[~same][:5].tolist()}"
