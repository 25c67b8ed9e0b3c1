import numpy as np
import pytest
import torch

import workbench
from workbench.kernels.gemm import batch_invariance, oracle, splitk_matmul, torch_ref
from workbench.numerics import round_to

def _xw(M, N, K, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g).to(dtype), (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)


def _sequential_fp32(x, w):
    """The slice sum the torch backend promises, written independently in numpy float32:
    acc = acc + x_k * w_k for k = 0, 1, ..., one rounding per multiply and per add."""
    xf = x.float().numpy()
    wt = w.float().numpy().T.copy()
    acc = np.zeros((xf.shape[0], wt.shape[1]), dtype=np.float32)
    for k in range(xf.shape[1]):
        acc = acc + xf[:, k:k + 1] * wt[k]
    return torch.from_numpy(acc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("out", ["fp32", "bf16"])
def test_one_split_fp32_partial_is_the_sequential_fp32_sum_bitwise(dtype, out):
    # bitwise equal to a k-ordered fp32 sum written in numpy, rounded once to out_dtype: the same
    # bits on any CPU (a BLAS matmul's bits depend on the CPU's vector width and vendor)
    x, w = _xw(5, 96, 512, dtype)
    y = splitk_matmul(x, w, splits=1, partial_dtype="fp32", out_dtype=out)
    assert torch.equal(y, _sequential_fp32(x, w).to(y.dtype))


def test_bits_do_not_depend_on_operand_alignment():
    # a BLAS picks its kernel by the pointer's alignment: a memory-mapped capture tensor (8-byte
    # aligned) and a fresh copy of it (64-byte aligned) got different fp32 bits from torch.matmul
    x, w = _xw(1, 16, 256, torch.float32, seed=3)
    buf = torch.empty(w.numel() + 16)
    for off in (0, 2, 5):
        wa = buf[off:off + w.numel()].view(w.shape)
        wa.copy_(w)
        for s in (1, 3, 8):
            assert torch.equal(splitk_matmul(x, wa, splits=s, partial_dtype="fp32", out_dtype="fp32"),
                               splitk_matmul(x, w, splits=s, partial_dtype="fp32", out_dtype="fp32"))


def test_bf16_partials_round_as_the_oracle_predicts():
    x, w = _xw(8, 512, 4096, seed=1)
    S = 9
    got = torch_ref.splitk_partials(x, w, splits=S, partial_dtype="bf16").double()
    exact = oracle.splitk_partials(x, w, splits=S)
    pred = torch.from_numpy(round_to(exact, "bf16"))
    # bound from the inputs fed: a slice of L bf16 x bf16 products (exact in fp32) summed in fp32
    # is within gamma_L = L u / (1 - L u) of sum |x_k w_k| of the exact sum (u = 2^-24); rounding
    # is monotone, so the stored bf16 partial lies between the roundings of the interval's ends,
    # and equals the rounding of the exact partial wherever those two agree
    L = max(b - a for a, b in oracle.slice_bounds(x.shape[1], S))
    gamma = L * 2.0 ** -24 / (1 - L * 2.0 ** -24)
    mag = torch.stack([x[:, a:b].double().abs() @ w[:, a:b].double().abs().T
                       for a, b in oracle.slice_bounds(x.shape[1], S)])
    err = gamma * mag * (1 + 1e-9)  # slack for the fp64 evaluation of the bound itself
    lo = torch.from_numpy(round_to(exact - err, "bf16"))
    hi = torch.from_numpy(round_to(exact + err, "bf16"))
    assert bool(((lo <= got) & (got <= hi)).all())
    decided = lo == hi
    assert torch.equal(got[decided], pred[decided])
    # and, exactly, the bf16 rounding of the k-ordered fp32 sum written independently in numpy
    seq = torch.stack([_sequential_fp32(x[:, a:b], w[:, a:b]) for a, b in oracle.slice_bounds(x.shape[1], S)])
    assert torch.equal(got, seq.bfloat16().double())
    assert (got == pred).double().mean().item() > 0.99  # misrounded only next to a bf16 boundary
    # the output shift of bf16 partials vs fp32 partials is the one the oracle predicts
    y16 = splitk_matmul(x, w, splits=S, partial_dtype="bf16", out_dtype="fp32").double()
    y32 = splitk_matmul(x, w, splits=S, partial_dtype="fp32", out_dtype="fp32").double()
    predicted = oracle.splitk_matmul(x, w, splits=S, partial_dtype="bf16") - exact.sum(0)
    assert not torch.equal(y16, y32)
    assert workbench.compare(predicted, y16 - y32).rel_l2 < 0.05


def test_tree_and_sequential_orders():
    parts = torch.tensor([1.0, 2.0 ** -24, 2.0 ** -24, -1.0])[:, None]
    assert torch_ref.reduce_partials(parts, "sequential").item() == 0.0  # 1 + 2^-24 rounds to 1 twice
    assert torch_ref.reduce_partials(parts, "tree").item() == 2.0 ** -24  # (1 + e) + (e - 1)


def test_batch_invariance_report():
    x, w = _xw(4, 32, 256, torch.float32)
    r = batch_invariance(lambda a: splitk_matmul(a, w, splits=3, backend="oracle"), x)
    assert r.invariant and r.rows == (True,) * 4 and "4/4" in str(r)
    bad = batch_invariance(lambda a: a * a.shape[0], x)  # depends on the batch: rows 0..3 differ
    assert not bad.invariant and bad.max_abs[0] > 0


def test_slice_bounds_by_hand():
    # ceil(K / splits) columns per slice, the last one shorter, none empty, every column once
    assert oracle.slice_bounds(10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert oracle.slice_bounds(10, 4) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert oracle.slice_bounds(7, 7) == [(i, i + 1) for i in range(7)]
    assert oracle.slice_bounds(4096, 9) == [(i * 456, min(4096, (i + 1) * 456)) for i in range(9)]
    assert oracle.slice_bounds(5, 1) == [(0, 5)]
