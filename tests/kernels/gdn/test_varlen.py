"""Packed variable-length batches (cu_seqlens) in every GDN backend: each sequence with its own
initial and final state, chunks never crossing a boundary, the packed result equal to the
sequences run alone."""

import pytest
import torch

from workbench.errors import KernelArgumentError
from workbench.kernels import gdn
from workbench.kernels.gdn._cases import packed_inputs, varlen_selfcheck

# empty, length-1, odd, longer than a chunk, a second empty one, and a chunk-multiple
LENGTHS = [0, 1, 5, 67, 0, 130, 64]


@pytest.mark.parametrize("backend", ["oracle", "torch", "ext"])
@pytest.mark.parametrize("op", ["recurrent", "chunked"])
def test_packed_equals_sequences_alone(backend, op):
    r = varlen_selfcheck(backend, op, LENGTHS, chunk_size=32 if op == "chunked" else None)
    assert r["bitwise"], r
    assert r["shape_o"] == [1, sum(LENGTHS), 2, 8] and r["shape_state"] == [len(LENGTHS), 2, 8, 8]
    tol = 1e-12 if backend == "oracle" else 1e-5
    assert r["o"] < tol and r["state"] < tol, r


def test_packed_oracle_matches_an_independent_per_sequence_loop():
    # the oracle's chunked form over a packed batch against its recurrence on each sequence
    x = packed_inputs([3, 0, 70, 1], H=2, HV=4, K=8, V=16, seed=3)
    o, s = gdn.chunked(**x, qk_l2norm=True, backend="oracle", chunk_size=16)
    cu = x["cu_seqlens"]
    for i in range(4):
        a, b = cu[i], cu[i + 1]
        part = {n: x[n][:, a:b] for n in ("q", "k", "v", "g", "beta")}
        if b == a:
            assert torch.equal(s[i], x["initial_state"][i].double())
            continue
        oi, si = gdn.recurrent(**part, initial_state=x["initial_state"][i:i + 1], qk_l2norm=True, backend="oracle")
        assert torch.allclose(o[:, a:b], oi, rtol=0, atol=1e-12) and torch.allclose(s[i:i + 1], si, rtol=0, atol=1e-12)


def test_packed_without_initial_states_and_a_tensor_of_offsets():
    x = packed_inputs([4, 9], state=False, seed=5)
    x["cu_seqlens"] = torch.tensor(x["cu_seqlens"], dtype=torch.int32)
    o, s = gdn.recurrent(**x, backend="torch")
    o1, s1 = gdn.recurrent(**{n: x[n][:, 4:] for n in ("q", "k", "v", "g", "beta")}, backend="torch")
    assert torch.equal(o[:, 4:], o1) and torch.equal(s[1:], s1)


def test_policy_applies_per_sequence():
    # a bf16 state is rounded inside each sequence; the packed batch equals the sequences alone
    x = packed_inputs([7, 20], seed=2)
    pol = {"state_dtype": "bf16"}
    o, s = gdn.chunked(**x, backend="torch", policy=pol, chunk_size=8)
    o2, s2 = gdn.chunked(**{n: x[n][:, 7:] for n in ("q", "k", "v", "g", "beta")},
                         initial_state=x["initial_state"][1:], backend="torch", policy=pol, chunk_size=8)
    assert torch.equal(o[:, 7:], o2) and torch.equal(s[1:], s2)


@pytest.mark.parametrize("bad, match", [
    ([1, 4], "start at 0"), ([0, 4], "end at T"), ([0, 5, 3, 9], "non-decreasing"), ([0], "start at 0"),
    ([0.0, 9.0], "ints"), (torch.tensor([0.0, 9.0]), "integer"), ("09", "ints"), ([0, True], "ints")])
def test_bad_offsets_are_named(bad, match):
    x = packed_inputs([9], seed=1)
    x["cu_seqlens"] = bad
    x["initial_state"] = None
    with pytest.raises(KernelArgumentError, match=match) as e:
        gdn.recurrent(**x, backend="torch")
    assert e.value.key == "cu_seqlens"


def test_packed_batch_shape_errors():
    x = packed_inputs([3, 4], seed=1)
    with pytest.raises(KernelArgumentError, match="one per sequence") as e:
        gdn.recurrent(**{**x, "initial_state": x["initial_state"][:1]}, backend="torch")
    assert e.value.key == "initial_state"
    two = {n: (t.expand(2, *t.shape[1:]) if isinstance(t, torch.Tensor) and n != "initial_state" else t)
           for n, t in x.items()}
    with pytest.raises(KernelArgumentError, match="B = 1"):
        gdn.chunked(**two, backend="oracle")


@pytest.mark.slow  # numba's CUDA simulator over a packed batch, both ops: about 30 s
def test_numba_packed_in_the_simulator(cudasim):
    for op in ("recurrent", "chunked"):
        r = cudasim("workbench.kernels.gdn._cases:varlen_selfcheck", "numba", op, [0, 1, 5, 17], 1, 2, 8, 8,
                    8 if op == "chunked" else None)
        assert r["bitwise"] and r["o"] < 1e-5 and r["state"] < 1e-5, (op, r)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["ext", "numba"])
@pytest.mark.parametrize("op", ["recurrent", "chunked"])
def test_packed_on_the_gpu(backend, op):
    r = varlen_selfcheck(backend, op, [0, 1, 5, 67, 0, 300, 64], H=2, HV=4, K=64, V=64, device="cuda")
    assert r["bitwise"] and r["o"] < 1e-4 and r["state"] < 1e-4, r


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["recurrent", "chunked"])
def test_fla_packed_close_to_the_oracle(op):
    pytest.importorskip("fla")
    r = varlen_selfcheck("fla", op, [1, 5, 67, 300, 64], H=2, HV=4, K=64, V=64, device="cuda")
    assert r["o"] < 1e-2 and r["state"] < 1e-2, r  # fla's own packed kernel: close, not bitwise


# -- the CUDA tensor-core path: a packed batch in one launch pair (per 128 sequences) --------------

MMA_LENGTHS = [0, 1, 5, 67, 0, 300, 64, 128, 129, 2]


@pytest.mark.gpu
@pytest.mark.parametrize("mma_pass", ["warp", "smem", "smem16", "pair"])
@pytest.mark.parametrize("K", [64, 128])
def test_packed_mma_one_launch_equals_sequences_alone(K, mma_pass, monkeypatch):
    """bf16 inputs: the packed batch runs in one launch; each sequence's result is bit for bit its
    result alone on the same pass (forced), and close to the oracle."""
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", mma_pass)
    r = varlen_selfcheck("ext", "chunked", MMA_LENGTHS, H=2, HV=4, K=K, V=K, device="cuda", dtype="bfloat16")
    assert r["bitwise"], r
    assert r["o"] < 5e-3 and r["state"] < 2e-3, r  # tf32 operands, o rounded to bf16
    assert r["shape_state"] == [len(MMA_LENGTHS), 4, K, K]


@pytest.mark.gpu
def test_packed_mma_more_sequences_than_one_launch(monkeypatch):
    """300 sequences (three launches of at most 128), empty and one-token ones among them."""
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", "smem")
    gen = torch.Generator().manual_seed(4)
    lengths = [int(x) for x in torch.randint(0, 90, (300,), generator=gen)]
    lengths[127:131] = [0, 1, 0, 65]  # around the first launch boundary
    r = varlen_selfcheck("ext", "chunked", lengths, H=1, HV=2, K=64, V=32, device="cuda", dtype="bfloat16", seed=2)
    assert r["bitwise"] and r["o"] < 5e-3 and r["state"] < 2e-3, r


@pytest.mark.gpu
def test_packed_mma_logs_its_pass_and_launch(monkeypatch):
    """The kernel log notes the pass of the packed launch (planned over its sequences' lengths:
    ext.mma_packed_passes), and the call is one chunked call, not one per sequence."""
    from workbench.kernels import registry
    from workbench.kernels.gdn import ext

    monkeypatch.delenv("WORKBENCH_GDN_MMA_PASS", raising=False)
    x = packed_inputs([100] * 40, H=16, HV=32, K=128, V=128, device="cuda", dtype=torch.bfloat16)
    with registry.kernel_log() as log:
        o, s = gdn.chunked(**x, backend="ext")
    rows = log.summary()
    assert len(rows) == 1 and rows[0]["calls"] == 1, rows
    want = ext.mma_packed_passes(x["cu_seqlens"], 32, 128, torch.bfloat16)
    assert rows[0]["path"] == "mma/" + want[0] == "mma/warp8", rows
    assert o.dtype == torch.bfloat16 and s.shape == (40, 32, 128, 128)
    # one sequence much longer than the rest: narrower blocks (the packed plan)
    x = packed_inputs([1000, 3001, 500, 2048, 77], H=16, HV=32, K=128, V=128, device="cuda", dtype=torch.bfloat16)
    want = ext.mma_packed_passes(x["cu_seqlens"], 32, 128, torch.bfloat16)
    with registry.kernel_log() as log:
        gdn.chunked(**x, backend="ext")
    assert log.summary()[0]["path"] == "mma/" + want[0], (log.summary(), want)
    if torch.cuda.get_device_properties(0).multi_processor_count == 132:  # H100 / H200 SXM
        assert want == ["warp4"]
