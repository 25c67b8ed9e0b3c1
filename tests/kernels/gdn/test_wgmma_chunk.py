"""The wgmma chunk-step timing kernel (kernels/gdn/gdn_wgmma_chunk.cu, benchmarks/gdn_wgmma_chunk.py):
it builds for sm_90a here without serialized wgmma; its five products agree with the float64
chain under the CPU emulation and (marked gpu) on the GPU, so that its timings are of products
that compute what they claim (tf32 and bf16 operands, register A operands from the accumulators,
B tiles in 128-byte swizzle)."""

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
    assert len(spills) == 3 and all(s.startswith("0 bytes stack frame, 0 bytes spill stores") for s in spills), spills


def test_reference_chain_is_the_products_in_order():
    """The float64 reference the GPU check uses: one chunk by hand."""
    b = _bench()
    ops = b.operands(seed=1)
    S, o = b.reference(ops, 0.5, 1)
    S0 = ops["S0"].astype(np.float64)
    nv = -(S0 @ ops["Bk"]) @ ops["Bt"]
    np.testing.assert_allclose(o, S0 @ ops["Bq"] + nv @ ops["Bp"])
    np.testing.assert_allclose(S, 0.5 * S0 + nv @ ops["Bk2"])


def _emu_run(kind, ops, decay=0.5, chunks=3):
    import ctypes
    lib = _native.load("gdn_wgmma_chunk_emu", ["gdn/gdn_wgmma_chunk_emu.cpp"], kind="cpu",
                       headers=["gdn/gdn_wgmma_chunk.cu", "common/mma_ops.h", "common/cuda_emu.h", "common/wgmma_tiles.h"])
    lib.wgmma_chunk_run.restype = ctypes.c_int
    lib.wgmma_chunk_run.argtypes = [ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 6 + [
        ctypes.c_float, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    S = np.full((128, 128), np.nan, np.float32)
    o = np.full((128, 64), np.nan, np.float32)
    arrs = [np.ascontiguousarray(ops[n]) for n in ("Bq", "Bk", "Bt", "Bp", "Bk2", "S0")]
    st = lib.wgmma_chunk_run({"tf32": 0, "bf16": 1, "bf16x2": 2}[kind], 1, *[a.ctypes.data for a in arrs], decay, chunks,
                             S.ctypes.data, o.ctypes.data, None)
    assert st == 0, st
    return S.astype(np.float64), o.astype(np.float64)


def _rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.skipif(_native.find_cxx() is None, reason="no C++ compiler")
def test_products_under_the_emulation_against_float64():
    """The same kernel on the CPU (kernels/gdn/gdn_wgmma_chunk_emu.cpp over the wgmma model):
    its three chunks agree with the float64 chain as the operand roundings allow: tf32 (A rounded
    to nearest, the float32 B tiles truncated) 4.8e-4 of it when written, bf16 (A and B rounded)
    2.3e-3, bf16 in two halves 3.7e-6; in that order. A wrong swizzle, k permutation, descriptor
    step or low half would be far off (an element read from the wrong row: rel L2 near 1; a low
    half dropped: the bf16 error)."""
    b = _bench()
    ops = b.operands()
    rs, ro = b.reference(ops, 0.5, 3)
    got = {k: _emu_run(k, ops) for k in ("tf32", "bf16", "bf16x2")}
    err = {k: (_rel(s, rs), _rel(o, ro)) for k, (s, o) in got.items()}
    assert max(err["tf32"]) < 1e-3 and max(err["bf16"]) < 1e-2 and max(err["bf16x2"]) < 2e-5, err
    assert err["bf16x2"][0] < err["tf32"][0] / 10 and err["tf32"][0] < err["bf16"][0] / 3, err


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
    err = {k: (v["rel_l2_S"], v["rel_l2_o"]) for k, v in got.items()}
    assert max(err["tf32"]) < 1e-3 and max(err["bf16"]) < 1e-2 and max(err["bf16x2"]) < 2e-5, err
    assert err["bf16x2"][0] < err["tf32"][0] / 10 and err["tf32"][0] < err["bf16"][0] / 3, err
