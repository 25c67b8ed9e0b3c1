"""QSA: sparse attention with an indexer, a paged split-KV decode and an output gate.

Layouts and contracts: docs/kernels/qsa.md. Backends: oracle (fp64), torch, numba, ext.
"""

from workbench.kernels.qsa.api import (block_keys, index_scores, merge_states, output_gate, select,
                                       sparse_decode)
from workbench.kernels.qsa.paged import PagedKVCache
from workbench.kernels.registry import register_backend

register_backend("qsa", "oracle", "workbench.kernels.qsa.oracle", description="FP64 truth (plain torch)")
register_backend("qsa", "torch", "workbench.kernels.qsa.torch_ref", description="torch with policy knobs")
register_backend("qsa", "numba", "workbench.kernels.qsa.numba_cuda", install_hint="pip install numba-cuda; needs a CUDA GPU",
                 description="numba.cuda split-KV decode kernels")
register_backend("qsa", "ext", "workbench.kernels.qsa.ext", install_hint="needs g++ (CPU) or nvcc (CUDA)",
                 description="native C++/CUDA split-KV decode (kernels/qsa)")

__all__ = ["block_keys", "index_scores", "select", "sparse_decode", "merge_states", "output_gate",
           "PagedKVCache"]
