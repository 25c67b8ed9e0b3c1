"""The wgmma chunk-step timing kernel (kernels/gdn/gdn_wgmma_chunk.cu, benchmarks/gdn_wgmma_chunk.py):
it builds for sm_90a here; on a GPU its five products agree with the float64 chain, so that its
timings are of products that compute what they claim (tf32 and bf16 operands, register A operands
from the accumulators, B tiles in 128-byte swizzle)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from workbench.kernels import _native

ROOT = Path(__file__).resolve().parents[3]


def _bench():
    spec = importlib.util.spec_from_file_location("gdn_wgmma_chunk", ROOT / "benchmarks" / "gdn_wgmma_chunk.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_builds_for_sm90a_without_serialized_wgmma():
    """nvcc builds it, and ptxas neither spills nor injects warpgroup waits or fences (which it does
    when a register a wgmma reads or writes is touched between two of them: the products would be
    serialized and the timing would not be the design's)."""
    if _native.find_nvcc() is None:
        pytest.skip("nvcc not found")
    import subprocess
    cmd = _native._command("cuda", [ROOT / "kernels/gdn/gdn_wgmma_chunk.cu"], Path("/dev/null"), ["-Xptxas", "-v"])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "C7517" not in proc.stderr and "C7519" not in proc.stderr, "ptxas serialized the wgmma"
    spills = [line.strip() for line in proc.stderr.splitlines() if "spill stores" in line]
    assert len(spills) == 2 and all(s.startswith("0 bytes stack frame, 0 bytes spill stores") for s in spills), spills


def test_reference_chain_is_the_products_in_order():
    """The float64 reference the GPU check uses: one chunk by hand."""
    b = _bench()
    ops = b.operands(seed=1)
    S, o = b.reference(ops, 0.5, 1)
    S0 = ops["S0"].astype(np.float64)
    nv = -(S0 @ ops["Bk"]) @ ops["Bt"]
    np.testing.assert_allclose(o, S0 @ ops["Bq"] + nv @ ops["Bp"])
    np.testing.assert_allclose(S, 0.5 * S0 + nv @ ops["Bk2"])


@pytest.mark.gpu
def test_gpu_products_against_float64():
    import torch
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    b = _bench()
    lib = b.load()
    ops = b.operands()
    dev = {n: torch.from_numpy(a).cuda() for n, a in ops.items()}
    got = b.check(lib, ops, dev, chunks=3)
    print(got)
    assert got["tf32"]["rel_l2_S"] < 5e-3 and got["tf32"]["rel_l2_o"] < 5e-3
    assert got["bf16"]["rel_l2_S"] < 3e-2 and got["bf16"]["rel_l2_o"] < 3e-2
    # tf32 operands (10-bit significands) are closer than bf16 ones (7-bit)
    assert got["tf32"]["rel_l2_S"] < got["bf16"]["rel_l2_S"]
