import pytest
import torch

import workbench
from workbench.kernels.gemm import batch_invariance, oracle, splitk_matmul, torch_ref
from workbench.numerics import round_to, ulp_of

def _bound(x, w, S, part):
    """Stated bound on |backend - oracle with partial rounding emulated|: one ulp of the partial
    format per slice (fp32 accumulation can cross a rounding boundary) plus the worst-case fp32
    summation error, (K/S + S) * 2^-24 * sum_k |x_k w_k|."""
    ulps = torch.as_tensor(ulp_of(oracle.splitk_partials(x, w, splits=S), part)).sum(0)
    mag = x.double().abs() @ w.double().abs().T
    return ulps + (x.shape[1] / S + S) * 2.0 ** -24 * mag



def _xw(M, N, K, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g).to(dtype), (torch.randn(N, K, generator=g) / K ** 0.5).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("out", ["fp32", "bf16"])
def test_one_split_fp32_partial_is_a_plain_fp32_matmul_bitwise(dtype, out):
    # asserted: bitwise equal to torch.matmul(x.float(), w.float().T) rounded once to out_dtype.
    # (CPU torch.matmul on bf16 operands blocks its sum differently and is not bitwise equal.)
    x, w = _xw(5, 96, 512, dtype)
    y = splitk_matmul(x, w, splits=1, partial_dtype="fp32", out_dtype=out)
    assert torch.equal(y, torch.matmul(x.float(), w.float().T).to(y.dtype))


CASES = [(1, 256, 4096, 9, "bf16", "sequential"), (4, 256, 4096, 16, "bf16", "tree"),
         (16, 128, 4096, 9, "fp32", "sequential"), (3, 64, 1000, 7, "fp16", "tree")]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"M{c[0]}-N{c[1]}-K{c[2]}-S{c[3]}-{c[4]}part-{c[5]}")
def test_matches_oracle_with_partial_rounding_emulated(case):
    M, N, K, S, part, order = case
    x, w = _xw(M, N, K)
    y = splitk_matmul(x, w, splits=S, partial_dtype=part, order=order, out_dtype="fp32")
    ref = splitk_matmul(x, w, splits=S, partial_dtype=part, order=order, backend="oracle")
    # the backend's partials differ from the emulation only where fp32 accumulation crossed a
    # rounding boundary of the partial format: at most one partial-format ulp per slice
    bound = _bound(x, w, S, part)
    assert bool((bound >= (y.double() - ref).abs()).all())
    assert workbench.compare(ref, y).rel_l2 < (1e-6 if part == "fp32" else 1e-3)


def test_bf16_partials_round_as_the_oracle_predicts():
    x, w = _xw(8, 512, 4096, seed=1)
    S = 9
    got = torch_ref.splitk_partials(x, w, splits=S, partial_dtype="bf16").double()
    exact = oracle.splitk_partials(x, w, splits=S)
    pred = torch.from_numpy(round_to(exact, "bf16"))
    same = (got == pred).double().mean().item()
    assert same > 0.99  # misrounded only next to a bf16 rounding boundary
    assert bool(((got - pred).abs() <= torch.from_numpy(ulp_of(exact, "bf16"))).all())
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
