"""Public API of workbench.kernels.gdn: identical signatures, validation, backend listing."""

import importlib
import inspect

import pytest
import torch

from workbench.errors import BackendUnavailableError, KernelArgumentError, UnknownBackendError
from workbench.kernels import backends, gdn
from workbench.kernels.gdn._cases import make_inputs

OPS = ["recurrent", "chunked", "gates", "causal_conv1d", "gated_rmsnorm"]
MODULES = ["oracle", "torch_ref", "numba_cuda", "ext", "fla", "flashinfer"]


def _public_without_backend(op):
    sig = inspect.signature(getattr(gdn, op))
    return sig.replace(parameters=[p for p in sig.parameters.values() if p.name not in ("backend", "fallback")])


@pytest.mark.parametrize("module", MODULES)
@pytest.mark.parametrize("op", OPS)
def test_signatures_identical(module, op):
    # importing a backend module must not need its hardware (numba, nvcc, fla are checked lazily)
    mod = importlib.import_module(f"workbench.kernels.gdn.{module}")
    if op not in mod.OPS:
        assert not hasattr(mod, op), f"{module} defines {op} without declaring it in OPS"
        return
    assert inspect.signature(getattr(mod, op)) == _public_without_backend(op)
    for name, p in inspect.signature(getattr(mod, op)).parameters.items():
        if name in ("scale", "initial_state", "qk_l2norm", "chunk_size", "policy", "state"):
            assert p.kind is p.KEYWORD_ONLY, name


def test_backends_listing():
    df = backends("gdn")
    assert list(df.name) == list(gdn.BACKENDS)
    row = df.set_index("name")
    assert row.loc["oracle", "available"] and row.loc["torch", "available"]
    for name in ("numba", "fla", "flashinfer"):  # no GPU in CI
        if not torch.cuda.is_available():
            assert not row.loc[name, "available"] and row.loc[name, "reason"]


@pytest.mark.parametrize("backend", ["ext", "numba", "fla"])
@pytest.mark.parametrize("op", ["gates", "causal_conv1d", "gated_rmsnorm"])
def test_a_backend_never_runs_another_backends_code_silently(backend, op):
    # the native, numba and fla backends implement recurrent and chunked only: asking them for a
    # helper op is a typed error naming who implements it, or, with fallback=, torch's code with a
    # warning and a record (never torch's result under another backend's name)
    from workbench.kernels import fallbacks
    from workbench.kernels.registry import BackendFallbackWarning, _FALLBACKS

    args = {"gates": (torch.zeros(1, 2, 2), torch.zeros(1, 2, 2), torch.zeros(2), torch.zeros(2)),
            "causal_conv1d": (torch.randn(1, 5, 4), torch.randn(4, 4)),
            "gated_rmsnorm": (torch.randn(3, 8), torch.randn(3, 8), torch.ones(8))}[op]
    with pytest.raises(BackendUnavailableError, match=rf"does not implement {op}; backends that do: \['oracle', 'torch'\]"):
        getattr(gdn, op)(*args, backend=backend)
    _FALLBACKS.pop(("gdn", backend, op), None)
    with pytest.warns(BackendFallbackWarning, match="running 'torch'"):
        got = getattr(gdn, op)(*args, backend=backend, fallback="torch")
    want = getattr(gdn, op)(*args, backend="torch")
    for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(a, b)
    assert {"family": "gdn", "op": op, "requested": backend, "ran": "torch"} in fallbacks()
    with pytest.raises(BackendUnavailableError, match="fallback 'ext'"):
        getattr(gdn, op)(*args, backend=backend, fallback="ext")


def test_backends_table_by_op():
    t = backends("gdn", by_op=True)
    assert set(t.columns) == {"op", "name", "implemented", "available", "reason"}
    ext = t[(t.name == "ext")].set_index("op")
    assert ext.loc["chunked", "implemented"] and not ext.loc["gates", "implemented"]
    assert "does not implement gates" in ext.loc["gates", "reason"]
    assert set(backends("gdn").set_index("name").loc["torch", "ops"]) == set(OPS)


def test_unavailable_and_unknown_backend():
    x = make_inputs()
    if not torch.cuda.is_available():
        with pytest.raises(BackendUnavailableError, match="flash-linear-attention"):
            gdn.recurrent(**x, backend="fla")
    with pytest.raises(UnknownBackendError, match="oracle"):
        gdn.recurrent(**x, backend="nope")


def _bad(**changes):
    x = make_inputs(B=2, T=3, H=2, HV=4, K=8, V=6, state=True)
    x.update(changes)
    return x


@pytest.mark.parametrize("changes, argument, words", [
    (dict(q=torch.randn(3, 2, 8)), "q", "rank 4"),
    (dict(k=torch.randn(2, 3, 2, 7)), "k", "shape"),
    (dict(v=torch.randn(2, 3, 3, 6)), "v", "multiple of H=2"),
    (dict(v=torch.randn(2, 3, 4, 6, dtype=torch.bfloat16)), "v", "dtype torch.float32"),
    (dict(g=torch.randn(2, 3, 2)), "g", "[B, T, HV]"),
    (dict(beta=torch.randn(2, 3)), "beta", "rank 3"),
    (dict(initial_state=torch.zeros(2, 4, 6, 8)), "initial_state", "(2, 4, 8, 6)"),
    (dict(initial_state=torch.zeros(2, 4, 8, 6, dtype=torch.bfloat16)), "initial_state", "float32"),
    (dict(q=torch.zeros(2, 3, 2, 8, dtype=torch.int32)), "q", "floating"),
    (dict(g=torch.zeros(2, 3, 4, device="meta")), "g", "device cpu"),
], ids=["q-rank", "k-shape", "HV-not-multiple", "v-dtype", "g-shape", "beta-rank", "state-shape",
        "state-dtype", "q-int", "g-device"])
@pytest.mark.parametrize("op", ["recurrent", "chunked"])
def test_bad_arguments(op, changes, argument, words):
    with pytest.raises(KernelArgumentError) as e:
        getattr(gdn, op)(**_bad(**changes))
    assert e.value.key == argument
    assert words in str(e.value) and "got" in str(e.value)


def test_bad_helper_arguments():
    with pytest.raises(KernelArgumentError, match="chunk_size"):
        gdn.chunked(**make_inputs(), chunk_size=0)
    with pytest.raises(KernelArgumentError, match="dt_bias"):
        gdn.gates(torch.zeros(1, 2, 4), torch.zeros(1, 2, 4), torch.zeros(4), torch.zeros(3))
    with pytest.raises(KernelArgumentError, match="state"):
        gdn.causal_conv1d(torch.zeros(1, 2, 4), torch.zeros(4, 4), state=torch.zeros(1, 4, 4))
    with pytest.raises(KernelArgumentError, match="z"):
        gdn.gated_rmsnorm(torch.zeros(2, 4), torch.zeros(2, 5), torch.ones(4))
    with pytest.raises(KernelArgumentError, match="scale"):
        gdn.recurrent(**make_inputs(), scale="0.1")
