"""Conformance: every registered backend of an op against the FP64 oracle, on one set of cases.

The backends come from the registry (``workbench.kernels.backends``), not from a list here: a
backend added by a plugin is tested by registering it. Each backend module declares the devices
it runs on (``DEVICES``); CUDA cases run on the GPU machine (``pytest -m gpu``). Tolerances are
the op's contract for the rounding points of the case (input dtype, probability or partial dtype),
the same for every backend; split-K GEMM is also held to a bound derived from its inputs.
"""

from __future__ import annotations

import math

import pytest
import torch

import workbench
from workbench.kernels import gdn, qsa
from workbench.kernels.gdn._cases import case_id, make_inputs
from workbench.kernels.gemm import oracle as gemm_oracle
from workbench.kernels.gemm import splitk_matmul
from workbench.kernels.qsa import torch_ref as qsa_torch
from workbench.kernels.qsa.problems import decode_problem
from workbench.kernels.registry import backends, devices, implemented_ops
from workbench.numerics import Policy, ulp_of

GPU = torch.cuda.is_available()


def _params(family: str, op: str, cases: dict[str, list]):
    """(backend, device, case) for every registered backend implementing ``op`` on every device it
    declares, with readable ids: ``<backend>-<device>-<case>``."""
    out = []
    for name in backends(family).name:
        if name == "oracle" or op not in implemented_ops(family, name):
            continue
        for dev in devices(family, name):
            for c in cases.get(dev, []):
                marks = [pytest.mark.gpu] if dev == "cuda" else []
                if c.get("only") and name not in c["only"]:
                    continue
                out.append(pytest.param(name, dev, c, id=f"{name}-{dev}-{c['id']}", marks=marks))
    return out


def _device_or_skip(dev: str) -> None:
    if dev == "cuda" and not GPU:
        pytest.skip("needs a CUDA GPU; run on the GPU machine (see ../shared/GPU.md)")


# -- GDN -------------------------------------------------------------------------------------------

DT = {"fp32": torch.float32, "bf16": torch.bfloat16}
GDN_TOL = {"fp32": 1e-5, "bf16": 5e-3}


def _gdn_case(op, B, T, H, HV, K, V, dt, state, only=None):
    return dict(op=op, dims=(B, T, H, HV, K, V), dt=dt, state=state, only=only,
                id=f"{op}-{case_id(B, T, H, HV, K, V, dt, state)}")


# T = 1 (decode), T not a multiple of the chunk, GVA 1/2/4, K != V; on CUDA the Qwen3.5-like heads
_GDN_CPU = [(1, 1, 2, 2, 16, 16, "fp32", True), (2, 1, 1, 4, 8, 16, "bf16", True), (1, 100, 2, 4, 16, 8, "fp32", False),
            (2, 70, 2, 2, 8, 16, "fp32", True), (1, 130, 1, 2, 16, 32, "bf16", True), (1, 64, 2, 8, 16, 16, "bf16", False)]
_GDN_CUDA = [("recurrent", 1, 1), ("recurrent", 16, 1), ("recurrent", 1, 1024), ("chunked", 1, 1000),
             ("chunked", 2, 4100), ("recurrent", 3, 300), ("chunked", 3, 300)]
GDN_CASES = {
    op: {"cpu": [_gdn_case(op, *c) for c in _GDN_CPU],
         "cuda": [_gdn_case(o, B, T, 16, 32, 128, 128, "bf16", True) for o, B, T in _GDN_CUDA if o == op]
         + [_gdn_case(op, 2, 300, 2, 4, 128, 128, "fp32", True, only=("torch", "ext", "numba")),
            _gdn_case(op, 1, 200, 2, 4, 64, 32, "bf16", True)]}
    for op in ("recurrent", "chunked")}


@pytest.mark.parametrize("backend, device, case",
                         _params("gdn", "recurrent", GDN_CASES["recurrent"])
                         + _params("gdn", "chunked", GDN_CASES["chunked"]))
def test_gdn_against_oracle(backend, device, case):
    _device_or_skip(device)
    x = make_inputs(*case["dims"], dtype=DT[case["dt"]], state=case["state"], seed=21, device=device)
    ref_o, ref_s = gdn.recurrent(**x, qk_l2norm=True, backend="oracle")
    o, s = getattr(gdn, case["op"])(**x, qk_l2norm=True, backend=backend)
    assert o.dtype == DT[case["dt"]] and s.dtype == torch.float32
    co, cs = workbench.compare(ref_o, o), workbench.compare(ref_s, s)
    assert co.rel_l2 <= GDN_TOL[case["dt"]], f"o: {co}"
    assert cs.rel_l2 <= GDN_TOL[case["dt"]], f"state: {cs}"


# -- QSA -------------------------------------------------------------------------------------------

PROB_TOL = {"fp32": 2e-6, "fp16": 2e-3, "bf16": 1e-2}  # the probabilities' format rounds the weights


def _qsa_case(B, HQ, HKV, D, T, budget, S, prob, dtype, order="logical"):
    return dict(shape=dict(B=B, HQ=HQ, HKV=HKV, D=D, seqlen=T, budget=budget, dtype=dtype),
                policy=Policy(prob_dtype=prob, num_kv_splits=S, page_order=order), prob=prob,
                id=f"B{B}-HQ{HQ}-HKV{HKV}-D{D}-T{T}-S{S}-{prob}prob-{str(dtype)[6:]}-{order}")


QSA_CASES = {
    "cpu": [_qsa_case(1, 24, 2, 256, 2600, 2048, 4, "fp32", torch.bfloat16),
            _qsa_case(3, 24, 2, 128, 900, 512, 3, "fp16", torch.bfloat16),
            _qsa_case(2, 4, 2, 64, 300, 128, 2, "bf16", torch.float16, "physical"),
            _qsa_case(2, 4, 1, 32, 100, 64, 5, "fp32", torch.float32),
            _qsa_case(3, 4, 4, 64, 200, 64, 1, "fp16", torch.float32)],
    "cuda": [_qsa_case(B, 24, 2, 256, 4096, 2048, 8, prob, torch.bfloat16, order)
             for B in (1, 16) for prob in ("fp32", "fp16") for order in ("logical", "physical")]
    + [_qsa_case(4, 16, 1, 128, 1000, 512, 3, "bf16", torch.float16)],
}


@pytest.mark.parametrize("backend, device, case", _params("qsa", "sparse_decode", QSA_CASES))
def test_qsa_sparse_decode_against_oracle(backend, device, case):
    _device_or_skip(device)
    pb = decode_problem(**case["shape"])
    ro, rlse = qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, backend="oracle")
    g = pb.to(device) if device != "cpu" else pb
    o, lse = qsa.sparse_decode(g.q, g.cache, g.cache.block_table, g.indices, policy=case["policy"], backend=backend)
    assert o.dtype == torch.float32 and lse.dtype == torch.float32
    assert workbench.compare(ro, o.cpu()).rel_l2 < PROB_TOL[case["prob"]]
    assert workbench.compare(rlse, lse.cpu()).rel_l2 < 1e-6


MERGE_CASES = {"cpu": [dict(id="B2-HQ8-S5-D64", S=5), dict(id="B2-HQ8-S1-D64", S=1), dict(id="B2-HQ8-S7-D64-empty", S=7,
                                                                                          empty=True)]}
MERGE_CASES["cuda"] = MERGE_CASES["cpu"]


@pytest.mark.parametrize("backend, device, case", _params("qsa", "merge_states", MERGE_CASES))
def test_qsa_merge_states_against_oracle(backend, device, case):
    _device_or_skip(device)
    pb = decode_problem(B=2, HQ=8, HKV=2, D=64, seqlen=900, budget=512, dtype=torch.float32, seed=4)
    parts, lses = qsa_torch.split_partials(pb.q, pb.cache, pb.cache.block_table, pb.indices, num_splits=case["S"],
                                           policy=Policy())
    if case.get("empty"):  # empty splits (lse -inf), and a row with every split empty
        lses[0, 0] = -math.inf
        lses[1, 2, 1] = -math.inf
    ro, rl = qsa.merge_states(parts, lses, backend="oracle")
    mo, ml = qsa.merge_states(parts.to(device), lses.to(device), backend=backend)
    mo, ml = mo.cpu(), ml.cpu()
    fin = torch.isfinite(rl)
    assert torch.equal(torch.isfinite(ml), fin) and bool((mo[~fin] == 0).all())
    assert workbench.compare(ro[fin], mo[fin]).rel_l2 < 1e-6 and workbench.compare(rl[fin], ml[fin]).rel_l2 < 1e-6


# -- split-K GEMM ----------------------------------------------------------------------------------

def _bound(x, w, S, part, tensor_cores=False):
    """|backend - oracle with partial rounding emulated| <= one partial-format ulp per slice plus
    the worst-case fp32 summation error (K/S + S) 2^-24 sum|x w| (+ 34 2^-24 sum|x w| for the
    tensor cores' truncated block products: docs/kernels/gemm.md)."""
    ulps = torch.as_tensor(ulp_of(gemm_oracle.splitk_partials(x, w, splits=S), part)).sum(0)
    mag = x.double().abs() @ w.double().abs().T
    return ulps + (x.shape[1] / S + S + (34 if tensor_cores else 0)) * 2.0 ** -24 * mag


def _gemm_case(M, N, K, S, part, order, dtype=torch.bfloat16, cols=None):
    return dict(M=M, N=N, K=K, S=S, part=part, order=order, dtype=dtype, cols=cols,
                id=f"M{M}-N{N}-K{K}-S{S}-{part}part-{order}-{str(dtype)[6:]}")


GEMM_CASES = {
    "cpu": [_gemm_case(1, 256, 4096, 9, "bf16", "sequential"), _gemm_case(4, 256, 4096, 16, "bf16", "tree"),
            _gemm_case(16, 128, 4096, 9, "fp32", "sequential"), _gemm_case(3, 64, 1000, 7, "fp16", "tree"),
            _gemm_case(1, 128, 4096, 1, "fp32", "sequential"), _gemm_case(2, 64, 1024, 16, "fp32", "tree", torch.float32)],
    # the lm_head of Qwen3-Next (N = 151936), the oracle on every 37th column to stay quick
    "cuda": [_gemm_case(M, 151936, 4096, 9, part, "sequential", cols=37) for M in (1, 9, 20) for part in ("fp32", "bf16")]
    + [_gemm_case(5, 200, 1000, 7, "fp16", "tree", torch.float16), _gemm_case(3, 96, 512, 4, "fp32", "tree", torch.float32)],
}


@pytest.mark.parametrize("backend, device, case", _params("gemm", "splitk_matmul", GEMM_CASES))
def test_gemm_splitk_against_oracle(backend, device, case):
    _device_or_skip(device)
    g = torch.Generator().manual_seed(0)
    M, N, K, S = case["M"], case["N"], case["K"], case["S"]
    x = torch.randn(M, K, generator=g).to(case["dtype"])
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(case["dtype"])
    kw = dict(splits=S, partial_dtype=case["part"], order=case["order"])
    y = splitk_matmul(x.to(device), w.to(device), out_dtype="fp32", backend=backend, **kw).cpu()
    cols = torch.arange(0, N, case["cols"]) if case["cols"] else torch.arange(N)
    ref = splitk_matmul(x, w[cols], backend="oracle", **kw)
    tensor_cores = device == "cuda" and backend == "ext" and case["dtype"] != torch.float32
    assert bool((_bound(x, w[cols], S, case["part"], tensor_cores) >= (y[:, cols].double() - ref).abs()).all())
    assert workbench.compare(ref, y[:, cols]).rel_l2 < (1e-6 if case["part"] == "fp32" else 1e-3)


def test_every_backend_is_in_the_conformance_suite():
    """A registered backend with an oracle-backed op and no case would be untested: none is."""
    for family, op in (("gdn", "recurrent"), ("gdn", "chunked"), ("qsa", "sparse_decode"), ("qsa", "merge_states"),
                       ("gemm", "splitk_matmul")):
        cases = {"gdn": GDN_CASES.get(op), "qsa": QSA_CASES if op == "sparse_decode" else MERGE_CASES,
                 "gemm": GEMM_CASES}[family]
        ids = {p.id.split("-")[0] for p in _params(family, op, cases)}
        want = {n for n in backends(family).name if n != "oracle" and op in implemented_ops(family, n)}
        assert ids == want, (family, op, want - ids)
