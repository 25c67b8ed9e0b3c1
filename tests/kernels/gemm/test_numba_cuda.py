import pytest



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
