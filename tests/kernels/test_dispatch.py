"""The dispatcher (workbench.kernels.registry.call): the one place a policy is resolved and checked
against what a backend declares it honours; refusals are one error type; calls are logged."""

from __future__ import annotations

import types
import warnings

import pytest
import torch

from workbench.errors import BackendUnavailableError, PolicyError
from workbench.kernels import gdn, qsa
from workbench.kernels.gdn._cases import make_inputs
from workbench.kernels.registry import REGISTRY, backends, call, honoured_knobs, kernel_log
from workbench.numerics.policy import Policy, use_policy


@pytest.fixture
def fake_backend():
    """A gdn backend registered as an object: it records the policy it is handed."""
    seen = []

    def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, qk_l2norm=False, policy=None):
        seen.append(policy)
        return torch.zeros_like(v), None

    mod = types.SimpleNamespace(OPS=("recurrent",), KNOBS={"state_dtype": ("fp32", "bf16"), "input_dtype": None},
                                recurrent=recurrent, is_available=lambda: (True, "test double"))
    state = REGISTRY.snapshot()
    REGISTRY.register("gdn.fake", mod)
    yield seen
    REGISTRY.restore(state)


def test_the_backend_receives_one_resolved_policy(fake_backend):
    x = make_inputs()
    with use_policy(state_dtype="bf16"):
        gdn.recurrent(**x, backend="fake")                                 # the current policy
    gdn.recurrent(**x, backend="fake", policy={"input_dtype": "bf16"})      # knobs over it
    assert [type(p) for p in fake_backend] == [Policy, Policy]
    assert fake_backend[0].state_dtype == "bf16" and fake_backend[1].input_dtype == "bf16"


def test_a_knob_the_backend_does_not_declare_is_refused_with_who_can(fake_backend):
    x = make_inputs()
    with pytest.raises(PolicyError) as e:
        gdn.recurrent(**x, backend="fake", policy={"accum_dtype": "fp64"})  # not declared: default only
    assert e.value.key == "accum_dtype" and "backends that do: ['torch', 'ext']" in e.value.message
    with pytest.raises(PolicyError, match=r"state_dtype='fp16' \(it honours \['fp32', 'bf16'\]\)"):
        gdn.recurrent(**x, backend="fake", policy={"state_dtype": "fp16"})
    assert not fake_backend  # refused before the backend ran
    assert honoured_knobs("gdn", "fake", "recurrent")["accum_dtype"] == ("fp32",)
    assert honoured_knobs("gdn", "oracle") is None  # the FP64 truth: the policy does not apply


def test_refusals_are_policy_errors_on_every_family_before_availability():
    # qsa numba cannot run without a GPU, but the refusal of a knob it never honours comes first
    q, cache = torch.randn(1, 4, 16), qsa.PagedKVCache.from_dense(torch.randn(1, 8, 1, 16), torch.randn(1, 8, 1, 16))
    idx = torch.tensor([[0, 1, 2, -1]], dtype=torch.int32)
    for backend in ("ext", "numba"):
        with pytest.raises(PolicyError, match="accum_dtype='fp64'"):
            qsa.sparse_decode(q, cache, cache.block_table, idx, policy={"accum_dtype": "fp64"}, backend=backend)
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailableError):  # a policy it honours: then availability speaks
            qsa.sparse_decode(q, cache, cache.block_table, idx, backend="numba")
    o, _ = qsa.sparse_decode(q, cache, cache.block_table, idx, policy={"accum_dtype": "fp64"}, backend="torch")
    assert o.shape == (1, 4, 16)


def test_kernel_log_records_backend_fallback_and_path():
    x = make_inputs()
    a = torch.zeros(1, 3, 4)
    with kernel_log() as outer:
        with kernel_log() as inner:
            gdn.recurrent(**x, backend="ext")
            gdn.recurrent(**x, backend="ext")
        with warnings.catch_warnings():  # warned about once per process (tests/kernels/gdn/test_api.py) ...
            warnings.simplefilter("ignore")
            gdn.gates(a, a, torch.zeros(4), torch.zeros(4), backend="ext", fallback="torch")
    rows = {(r["op"], r["ran"]): r for r in outer.summary()}
    assert rows[("recurrent", "ext")]["calls"] == 2 and rows[("recurrent", "ext")]["path"] == "scalar"
    assert rows[("gates", "torch")]["backend"] == "ext"  # ... and recorded in the log
    assert outer.fallbacks == [rows[("gates", "torch")]]
    assert [r["op"] for r in inner.summary()] == ["recurrent"]


def test_backends_table_shows_the_knobs_each_backend_honours():
    t = backends("gdn").set_index("name")
    assert t.loc["fla", "knobs"]["chunk_size"] == [64]
    assert t.loc["torch", "knobs"]["state_dtype"] == "any"
    assert t.loc["numba", "knobs"]["chunk_size"] == "1..64"
    assert "does not apply" in t.loc["oracle", "knobs"]


def test_call_is_the_family_entry_point():
    x = make_inputs()
    o1, s1 = call("gdn", "torch", "recurrent", *(x[k] for k in ("q", "k", "v", "g", "beta")))
    o2, s2 = gdn.recurrent(**x)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)


def test_note_path_calls_a_function_only_while_a_log_records():
    from workbench.kernels import registry
    calls = []

    def path():
        calls.append(1)
        return "mma/warp4"
    registry.note_path(path)  # no dispatched call recording: nothing asked
    assert calls == []
    event = {"path": None}
    token = registry._CURRENT.set(event)  # what call() sets while a kernel_log records
    try:
        registry.note_path(path)
    finally:
        registry._CURRENT.reset(token)
    assert calls == [1] and event["path"] == "mma/warp4"
