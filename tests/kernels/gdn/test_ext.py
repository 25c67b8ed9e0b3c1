"""ext backend: the CPU build against the oracle (CI), the CUDA source compiled with nvcc when
present, and the CUDA build run on the GPU."""

import pytest
import torch

import workbench
from workbench.errors import KernelArgumentError
from workbench.kernels import _native, gdn
from workbench.kernels.gdn import ext, oracle
from workbench.kernels.gdn._cases import case_id, make_inputs
from workbench.numerics.policy import Policy

CASES = [
    (1, 1, 2, 2, 16, 16, "fp32", True),
    (3, 1, 1, 4, 16, 8, "bf16", True),
    (1, 100, 2, 4, 16, 8, "fp32", False),
    (2, 70, 2, 2, 8, 16, "fp32", True),
    (1, 130, 1, 2, 16, 32, "bf16", True),
]
DT = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOL = {"fp32": 1e-5, "bf16": 5e-3}

pytestmark = pytest.mark.skipif(_native.find_cxx() is None, reason="no C++ compiler")


@pytest.mark.parametrize("case", CASES, ids=[case_id(*c) for c in CASES])
@pytest.mark.parametrize("op", ["recurrent", "chunked"])
def test_cpu_against_oracle(case, op):
    *dims, dt, state = case
    x = make_inputs(*dims, dtype=DT[dt], state=state, seed=7)
    ref_o, ref_s = oracle.recurrent(**x, qk_l2norm=True)
    o, s = getattr(gdn, op)(**x, qk_l2norm=True, backend="ext")
    assert o.dtype == DT[dt] and s.dtype == torch.float32
    assert workbench.compare(ref_o, o).rel_l2 <= TOL[dt]
    assert workbench.compare(ref_s, s).rel_l2 <= TOL[dt]


def test_cpu_policy():
    x = make_inputs(1, 40, 1, 2, 16, 16, state=True, seed=8)
    ref_o, _ = oracle.recurrent(**x, qk_l2norm=True)
    e = lambda op, p: workbench.compare(ref_o, getattr(gdn, op)(**x, qk_l2norm=True,
                                                                 backend="ext", policy=p)[0]).rel_l2
    for op in ("recurrent", "chunked"):
        assert e(op, Policy(accum_dtype="fp64")) <= e(op, Policy()) * 1.01
        assert e(op, Policy(input_dtype="bf16")) > 1e-4
    o, _ = gdn.chunked(**x, qk_l2norm=True, backend="ext", chunk_size=16,
                       policy=Policy(output_dtype="bf16"))
    assert o.dtype == torch.bfloat16 and workbench.compare(ref_o, o).rel_l2 < 5e-3
    with pytest.raises(KernelArgumentError, match="state_dtype"):
        gdn.recurrent(**x, backend="ext", policy=Policy(state_dtype="bf16"))


@pytest.mark.skipif(_native.find_nvcc() is None, reason="nvcc not found")
def test_cuda_source_compiles():
    # compiled, not run: the CI machine has nvcc but no GPU
    path = _native.build("gdn", ext.SOURCES["cuda"], kind="cuda", headers=ext.HEADERS)
    assert path.exists() and path.stat().st_size > 0


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["recurrent", "chunked"])
def test_cuda_against_oracle(op):
    x = make_inputs(2, 200, 2, 4, 128, 64, dtype=torch.bfloat16, state=True, seed=9, device="cuda")
    ref_o, ref_s = oracle.chunked(**x, qk_l2norm=True)
    o, s = getattr(gdn, op)(**x, qk_l2norm=True, backend="ext")
    assert workbench.compare(ref_o, o).rel_l2 <= 5e-3
    assert workbench.compare(ref_s, s).rel_l2 <= 5e-3
