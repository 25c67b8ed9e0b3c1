"""Split-K GEMM (projections, lm_head) and a batch-invariance check. Contract: docs/kernels/gemm.md."""

from workbench.kernels.gemm.api import BatchInvariance, batch_invariance, splitk_matmul
from workbench.kernels.registry import register_backend

register_backend("gemm", "oracle", "workbench.kernels.gemm.oracle", description="FP64, partial rounding emulated")
register_backend("gemm", "torch", "workbench.kernels.gemm.torch_ref", description="torch fp32 slices, summed in k order")
register_backend("gemm", "numba", "workbench.kernels.gemm.numba_cuda", install_hint="pip install numba-cuda; needs a CUDA GPU",
                 description="numba.cuda split-K kernels")
register_backend("gemm", "ext", "workbench.kernels.gemm.ext", install_hint="needs g++ (CPU) or nvcc (CUDA)",
                 description="native C++/CUDA split-K (kernels/gemm)")

__all__ = ["splitk_matmul", "batch_invariance", "BatchInvariance"]
