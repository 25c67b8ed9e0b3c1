"""numba backend: kernels in the CUDA simulator on tiny grids, every kernel signature compiled to
PTX for sm_90, the policy it refuses (on the GPU against the oracle: tests/kernels/test_conformance.py)."""

import pytest
import torch

import workbench
from workbench.errors import PolicyError
from workbench.kernels import gdn
from workbench.kernels.gdn import numba_cuda
from workbench.kernels.gdn._cases import case_id, make_inputs

numba_cuda_mod = pytest.importorskip("numba.cuda")

# B, T, H, HV, K, V, chunk: decode (T=1), T not a multiple of the chunk, GVA 1/2/4, K != V, two
# column tiles with a partly idle one (V=40)
SIM = [
    ("recurrent", (2, 1, 1, 2, 8, 8), None),
    ("recurrent", (1, 5, 1, 2, 8, 8), None),
    ("recurrent", (1, 4, 1, 4, 8, 40), None),
    ("chunked", (1, 5, 1, 2, 8, 8), None),
    ("chunked", (1, 11, 2, 2, 16, 8), 4),
    ("chunked", (1, 9, 1, 4, 8, 40), 8),
]


@pytest.mark.parametrize("op, dims, chunk", SIM,
                         ids=[f"{op}-{case_id(*d)}" + (f"-C{c}" if c else "") for op, d, c in SIM])
def test_simulator_against_oracle(cudasim, op, dims, chunk):
    r = cudasim("workbench.kernels.gdn._cases:selfcheck", "numba", op, *dims, True, chunk)
    assert r["o"] <= 1e-5 and r["state"] <= 1e-5, r


@pytest.mark.parametrize("K, V, C", [(128, 128, 64), (256, 128, 64), (64, 32, 32)],
                         ids=["K128-V128-C64", "K256-V128-C64", "K64-V32-C32"])
def test_every_kernel_compiles_to_ptx_sm90(K, V, C):
    for name, (fn, sig) in numba_cuda.kernel_sources(K, V, C).items():
        ptx, _ = numba_cuda_mod.compile_ptx(fn, sig, cc=(9, 0))
        assert ".target sm_90" in ptx and ".entry" in ptx, name
        assert ".local" not in ptx, f"{name} spills its state to local memory"
        if name == "recurrent_bf16_h0_l2" and V >= 16:  # the L2 factors by warp shuffles
            assert "shfl.sync.bfly" in ptx, name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_cpu_tensors_without_gpu_are_refused():
    ok, reason = numba_cuda.is_available()
    assert not ok and "NUMBA_ENABLE_CUDASIM" in reason
    with pytest.raises(workbench.errors.BackendUnavailableError, match="numba"):
        gdn.recurrent(**make_inputs(), backend="numba")


def test_policy_limits():
    x = make_inputs()
    with pytest.raises(PolicyError, match=r"chunk_size=128 \(it honours 1..64\)"):
        gdn.chunked(**x, chunk_size=128, backend="numba")
    with pytest.raises(PolicyError, match="accum_dtype"):
        gdn.recurrent(**x, policy={"accum_dtype": "fp64"}, backend="numba")
    with pytest.raises(PolicyError, match="cuda_path"):
        gdn.chunked(**x, policy={"cuda_path": "mma"}, backend="numba")

