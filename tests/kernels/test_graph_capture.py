"""The public kernel calls read no device value, so they can be captured in a CUDA graph.

GPU tests capture the public ``qsa.sparse_decode``, ``gdn.recurrent``, ``gdn.chunked`` and
``gemm.splitk_matmul`` calls (ext and numba backends) and check that the replayed graph gives the
eager result bit for bit. The CPU tests check the contract underneath: argument checks on a
non-CPU device read shapes only (meta tensors have no values to read), ``check=True`` still reads
them, and the dispatcher's timing log counts a call instead of synchronizing while capturing.
"""

from __future__ import annotations

import pytest
import torch

from workbench.errors import KernelArgumentError
from workbench.kernels import gdn, gemm, qsa, registry
from workbench.kernels.qsa.paged import check_decode_args
from workbench.kernels.qsa.problems import decode_problem
from workbench.numerics.policy import Policy


def _meta_decode_args(bad: bool):
    q = torch.empty(2, 8, 64, device="meta")
    cache = torch.empty(16, 4, 2, 64, device="meta")
    bt = torch.empty(2, 8, dtype=torch.int32, device="meta")
    idx = torch.empty(2, 12, dtype=torch.int32, device="meta")
    return q, cache, cache, bt, idx


def test_decode_checks_read_no_values_off_the_cpu():
    # meta tensors carry shapes and no values: reading one (int(indices.min())) raises
    args = _meta_decode_args(bad=False)
    check_decode_args(*args, 2)  # default: values are not read off the CPU
    check_decode_args(*args, 2, check=False)
    with pytest.raises((NotImplementedError, RuntimeError)):
        check_decode_args(*args, 2, check=True)  # the debug mode reads them


def test_decode_checks_still_reject_bad_values_on_cpu():
    pb = decode_problem(B=1, HQ=4, HKV=1, D=16, seqlen=40, budget=16, seed=1)
    bad = pb.indices.clone()
    bad[0, 0] = 10_000
    with pytest.raises(KernelArgumentError, match="block_table"):
        qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, bad)
    # every backend checks its own arguments (shapes always, values of CPU tensors), called
    # through the public function or directly
    from workbench.kernels.qsa import ext, oracle, torch_ref
    for fn in (oracle.sparse_decode, torch_ref.sparse_decode, ext.sparse_decode):
        with pytest.raises(KernelArgumentError, match="block_table"):
            fn(pb.q, pb.cache, pb.cache.block_table, bad, policy=Policy())
        with pytest.raises(KernelArgumentError, match="num_splits"):
            fn(pb.q, pb.cache, pb.cache.block_table, pb.indices, num_splits=0, policy=Policy())
    with pytest.raises(KernelArgumentError, match="num_splits"):
        qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, num_splits=0, check=False)
    check_decode_args(pb.q, pb.cache.k, pb.cache.v, pb.cache.block_table, bad, 2, check=False)


def test_timing_log_separates_first_calls(monkeypatch):
    monkeypatch.setattr(registry, "_SEEN", set())
    q = k = torch.randn(1, 3, 2, 8)
    v = torch.randn(1, 3, 2, 8)
    g, beta = -torch.rand(1, 3, 2), torch.rand(1, 3, 2)
    with registry.kernel_log(timing=True) as log:
        for _ in range(4):
            gdn.recurrent(q, k, v, g, beta, backend="torch")
    (t,) = log.timings()
    assert (t["backend"], t["op"], t["device"], t["calls"], t["first_calls"]) == ("torch", "recurrent", "cpu", 4, 1)
    assert t["kernel_s"] > 0 and t["one_time_s"] >= 0 and t["total_s"] >= 3 * t["kernel_s"]
    with registry.kernel_log() as plain:
        gdn.recurrent(q, k, v, g, beta, backend="torch")
    assert plain.timings() == [] and plain.summary()[0]["calls"] == 1


def test_cached_dispatch_still_checks_each_policy():
    # the dispatcher remembers a backend and the policies found honoured; another policy is
    # still checked: ext honours state_dtype fp32 only
    from workbench.errors import PolicyError
    q = k = torch.randn(1, 2, 1, 8)
    v = torch.randn(1, 2, 1, 8)
    g, beta = -torch.rand(1, 2, 1), torch.rand(1, 2, 1)
    o1, s1 = gdn.recurrent(q, k, v, g, beta, backend="ext")
    o2, s2 = gdn.recurrent(q, k, v, g, beta, backend="ext", policy={"state_dtype": "fp32"})
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    for _ in range(2):
        with pytest.raises(PolicyError, match="state_dtype"):
            gdn.recurrent(q, k, v, g, beta, backend="ext", policy={"state_dtype": "bf16"})


def test_resolve_device_and_runnable():
    assert registry.resolve_device("cpu").type == "cpu"
    assert registry.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    ok, why = registry.runnable("gemm", ["torch", "numba"], torch.device("cpu"))
    assert ok == ["torch"] and "numba" in why and why["numba"]
    from workbench.errors import BackendUnavailableError, UnknownBackendError
    with pytest.raises(UnknownBackendError):
        registry.runnable("gemm", ["tourch"], torch.device("cpu"))
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailableError, match="no CUDA GPU"):
            registry.resolve_device("cuda")


# -- on the GPU: capture the public calls ---------------------------------------------------------

def _graphed(step):
    """The eager result of ``step`` and that of a CUDA graph captured from it (replayed once)."""
    ref = step()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # warm-up on a side stream (numba JIT, native build) before capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with registry.kernel_log(timing=True) as log:  # a timing log must not synchronize under capture
        with torch.cuda.graph(graph):
            out = step()
    graph.replay()
    torch.cuda.synchronize()
    assert log.summary() and log.timings() == []
    return ref, out


def _same(a, b):
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    for x, y in zip(a, b):
        if x is not None:
            assert torch.equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["ext", "numba"])
def test_public_sparse_decode_is_capturable(backend):
    pb = decode_problem(B=4, HQ=16, HKV=2, D=128, seqlen=2048, budget=512, seed=3).to("cuda")
    pol = Policy(num_kv_splits=4)
    ref, out = _graphed(lambda: qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, policy=pol,
                                                  backend=backend))
    _same(ref, out)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        with pytest.raises(KernelArgumentError, match="check"):  # the debug mode says why it cannot
            qsa.sparse_decode(pb.q, pb.cache, pb.cache.block_table, pb.indices, policy=pol, backend=backend,
                              check=True)


def _gdn_inputs(T, B=2, H=4, HV=8, K=64, V=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.randn(B, T, H, K, generator=gen)
    v = torch.randn(B, T, HV, V, generator=gen)
    g = -0.1 * torch.rand(B, T, HV, generator=gen)
    beta = torch.rand(B, T, HV, generator=gen)
    s0 = 0.1 * torch.randn(B, HV, K, V, generator=gen)
    return [x.cuda() for x in (q, k, v, g, beta, s0)]


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["ext", "numba"])
def test_public_gdn_decode_is_capturable(backend):
    q, k, v, g, beta, s0 = _gdn_inputs(T=1)
    ref, out = _graphed(lambda: gdn.recurrent(q, k, v, g, beta, initial_state=s0, qk_l2norm=True, backend=backend))
    _same(ref, out)


@pytest.mark.gpu
def test_public_gdn_chunked_is_capturable():
    q, k, v, g, beta, s0 = _gdn_inputs(T=200)
    ref, out = _graphed(lambda: gdn.chunked(q, k, v, g, beta, initial_state=s0, qk_l2norm=True, backend="ext"))
    _same(ref, out)


@pytest.mark.gpu
def test_public_gdn_packed_chunked_is_capturable():
    # a packed batch on the tensor-core path (bf16; offsets a list, read on the host): one launch
    q, k, v, g, beta, _ = _gdn_inputs(T=300, B=1, K=128, V=128)
    q, k, v = (x.bfloat16() for x in (q, k, v))
    cu = [0, 7, 7, 150, 300]
    s0 = 0.1 * torch.randn(4, 8, 128, 128, device="cuda")
    ref, out = _graphed(lambda: gdn.chunked(q, k, v, g, beta, initial_state=s0, cu_seqlens=cu, qk_l2norm=True,
                                            backend="ext"))
    _same(ref, out)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["ext", "numba"])
def test_public_splitk_is_capturable(backend):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(16, 512, generator=gen).cuda()
    w = torch.randn(256, 512, generator=gen).cuda()
    ref, out = _graphed(lambda: gemm.splitk_matmul(x, w, splits=4, partial_dtype="bf16", backend=backend))
    _same(ref, out)
