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
