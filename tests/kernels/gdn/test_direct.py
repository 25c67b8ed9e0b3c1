"""The copy-free recurrence (decode through the public call): ext (CPU build here, CUDA build on
the GPU) and numba (CUDA simulator here, the GPU there) read q, k, v, g, beta in their dtypes,
apply the L2 norm in the kernel, read the initial state where it lies, write o in the output dtype
(rounded once, as torch rounds) and launch nothing else."""

import pytest
import torch

from workbench.errors import KernelArgumentError
from workbench.kernels import gdn
from workbench.kernels.gdn import ext
from workbench.kernels.gdn._cases import direct_selfcheck, make_inputs
from workbench.kernels.gdn._checks import check_gdn

from tests.conftest import has_cuda


def _assert(r):
    assert r["bitwise"], r["mismatches"]
    assert r["rounding"] == {"probes_pass": True, "bf16": True, "fp16": True}, r["rounding"]
    assert r["o"] < 4e-3 and r["state"] < 1e-5, r   # o: its bf16 rounding; state float32


def test_ext_cpu_direct_recurrence():
    _assert(direct_selfcheck("ext"))


def test_numba_simulator_direct_recurrence(cudasim):
    _assert(cudasim("workbench.kernels.gdn._cases:direct_selfcheck", "numba", "cpu", 0, False))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["ext", "numba"])
def test_gpu_direct_recurrence(backend):
    if not has_cuda():
        pytest.skip("needs a CUDA GPU")
    _assert(direct_selfcheck(backend, device="cuda"))


def test_ext_decode_makes_no_staging_copies():
    """A bf16 decode step with a float32 initial state allocates o and the new state and nothing
    else (torch's profiler sees no copy or cast op)."""
    x = make_inputs(4, 1, 2, 4, 16, 16, dtype=torch.bfloat16, state=True)
    gdn.recurrent(**x, qk_l2norm=True, backend="ext")   # build and warm up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        o, s = gdn.recurrent(**x, qk_l2norm=True, backend="ext")
    ops = {e.key for e in prof.key_averages()}
    assert not ops & {"aten::copy_", "aten::_to_copy", "aten::clone", "aten::contiguous", "aten::mul",
                      "aten::zeros", "aten::fill_"}, sorted(ops)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    assert s.data_ptr() != x["initial_state"].data_ptr()


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_gpu_mma_prefill_reads_the_initial_state_where_it_lies(packed):
    """The chunked call on the mma path neither copies nor zero-fills the state before its kernels
    (they read the initial state where it lies and write the final state to a new tensor): bit
    for bit the kernels updating a staged copy in place, the caller's tensor unchanged; a packed
    batch with empty sequences likewise."""
    if not has_cuda():
        pytest.skip("needs a CUDA GPU")
    from workbench.kernels.gdn._cases import packed_inputs
    if packed:
        x = packed_inputs([0, 70, 1, 130, 0, 64], H=2, HV=4, K=128, V=64, dtype=torch.bfloat16,
                          seed=61, device="cuda")
    else:
        x = make_inputs(2, 150, 2, 4, 128, 64, dtype=torch.bfloat16, state=True, seed=61,
                        device="cuda")
    s0 = x["initial_state"].clone()
    gdn.chunked(**x, qk_l2norm=True, backend="ext")  # build and warm up
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        o, s = gdn.chunked(**x, qk_l2norm=True, backend="ext")
    ops = {e.key for e in prof.key_averages()}
    assert not ops & {"aten::clone", "aten::zeros", "aten::zero_", "aten::fill_"}, sorted(ops)
    assert torch.equal(x["initial_state"], s0) and s.data_ptr() != s0.data_ptr()
    assert torch.isfinite(o.float()).all() and torch.isfinite(s).all()
    # the same kernels on a staged copy, updated in place
    cu = x.pop("cu_seqlens", None)
    st = ext.staged("chunked", **{**x, "initial_state": None if packed else x["initial_state"]},
                    qk_l2norm=True)
    state = s0.clone() if packed else st.state
    ro = torch.empty(st.s.B, st.s.T, st.s.HV, st.s.V, dtype=o.dtype, device="cuda")
    ext.launch("chunked", st.s, st.chunk, st.acc64, st.tensors, state, ro, path="mma",
               qk_l2norm=st.qk_l2norm, cu_seqlens=cu)
    assert torch.equal(o, ro) and torch.equal(s, state)


def test_ext_launch_refuses_mixed_qkv_dtypes_and_bad_h0():
    x = make_inputs(1, 2, 1, 2, 8, 8)
    sh = check_gdn(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None)
    t = (x["q"], x["k"].bfloat16(), x["v"], x["g"], x["beta"])
    st, o = torch.zeros(1, 2, 8, 8), torch.empty(1, 2, 2, 8)
    with pytest.raises(KernelArgumentError, match="one dtype for all three"):
        ext.launch("recurrent", sh, 0, 0, t, st, o)
    t = (x["q"], x["k"], x["v"], x["g"].double(), x["beta"])
    with pytest.raises(KernelArgumentError, match="g: the ext recurrence reads"):
        ext.launch("recurrent", sh, 0, 0, t, st, o)
    t = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    with pytest.raises(KernelArgumentError, match="h0: expected a contiguous float32"):
        ext.launch("recurrent", sh, 0, 0, t, st, o, h0=torch.zeros(1, 2, 8, 8, dtype=torch.float64))


def test_policy_input_dtype_is_materialized_before_the_kernel():
    """input_dtype bf16 on float32 inputs: the same result as rounding the inputs first."""
    x = make_inputs(2, 3, 1, 2, 8, 8, state=True)
    o, s = gdn.recurrent(**x, backend="ext", policy={"input_dtype": "bf16"})
    r = {n: (t.bfloat16() if n in ("q", "k", "v", "beta") else t) for n, t in x.items()}
    o2, s2 = gdn.recurrent(**r, backend="ext", policy={"output_dtype": "fp32"})
    assert o.dtype == torch.float32
    assert torch.equal(o, o2) and torch.equal(s, s2)
