import importlib
import inspect

import pytest
import torch

from workbench.errors import BackendUnavailableError, KernelArgumentError
from workbench.kernels import backends, qsa
from workbench.kernels.qsa.problems import decode_problem

MODULES = ["oracle", "torch_ref", "numba_cuda", "ext"]
OPS = ["block_keys", "index_scores", "select", "sparse_decode", "merge_states", "output_gate"]


@pytest.mark.parametrize("op", OPS)
def test_backends_share_keyword_signatures(op):
    public = inspect.signature(getattr(qsa, op))
    expected = [p for n, p in public.parameters.items() if n not in ("backend", "fallback", "check")]
    for m in MODULES:
        mod = importlib.import_module(f"workbench.kernels.qsa.{m}")
        fn = getattr(mod, op, None)
        assert (fn is not None) == (op in mod.OPS), (m, op)
        if fn is not None:
            assert list(inspect.signature(fn).parameters.values()) == expected, (m, op)


def test_registry_lists_backends():
    df = backends("qsa")
    assert set(df.name) == {"oracle", "torch", "numba", "ext"}
    assert bool(df.set_index("name").loc["torch", "available"])


@pytest.fixture(scope="module")
def pb():
    return decode_problem(B=2, HQ=4, HKV=2, D=16, seqlen=40, budget=16)


def _call(pb, **over):
    a = dict(q=pb.q, kv_cache=pb.cache, block_table=pb.cache.block_table, indices=pb.indices)
    a.update(over)
    return qsa.sparse_decode(a.pop("q"), a.pop("kv_cache"), a.pop("block_table"), a.pop("indices"), **a)


@pytest.mark.parametrize("over, arg", [
    (lambda pb: dict(indices=torch.where(pb.indices >= 0, pb.indices + 1000, pb.indices)), "block_table"),
    (lambda pb: dict(indices=pb.indices - 5), "indices"),
    (lambda pb: dict(block_table=pb.cache.block_table[:, :3]), "block_table"),
    (lambda pb: dict(q=torch.randn(2, 3, 16).bfloat16()), "q"),
    (lambda pb: dict(q=pb.q.float()), "k_cache"),
    (lambda pb: dict(indices=pb.indices.float()), "indices"),
    (lambda pb: dict(indices=pb.indices[:1]), "indices"),
    (lambda pb: dict(num_splits=0), "num_splits"),
    (lambda pb: dict(kv_cache=(pb.cache.k, pb.cache.v[..., :8])), "v_cache"),
], ids=["index-past-table", "index-below-minus-one", "short-block-table", "mismatched-heads", "dtype-mismatch",
        "float-indices", "batch-mismatch", "zero-splits", "k-v-shapes"])
def test_bad_input_names_the_argument(pb, over, arg):
    with pytest.raises(KernelArgumentError) as e:
        _call(pb, **over(pb))
    assert e.value.key == arg and "got" in str(e.value) and "fix:" in str(e.value)


def test_unallocated_page_is_refused(pb):
    bt = pb.cache.block_table.clone()
    bt[0, int(pb.indices[0, 0]) // 4] = -1
    with pytest.raises(KernelArgumentError, match="allocated pages"):
        _call(pb, block_table=bt)


def test_other_argument_errors():
    with pytest.raises(KernelArgumentError, match="budget"):
        qsa.select(torch.zeros(1, 4), budget=6, ratio=4, pos=3)
    with pytest.raises(KernelArgumentError, match="order"):
        qsa.select(torch.zeros(1, 4), budget=8, pos=3, order="random")
    with pytest.raises(KernelArgumentError, match="gate"):
        qsa.output_gate(torch.zeros(1, 2, 4), torch.zeros(1, 2, 3))
    with pytest.raises(KernelArgumentError, match="lse_parts"):
        qsa.merge_states(torch.zeros(1, 2, 4), torch.zeros(1, 3))
    with pytest.raises(KernelArgumentError, match="block_keys"):
        qsa.index_scores(torch.zeros(1, 2, 4), torch.zeros(1, 3, 5), pos=3)


def test_gpu_backend_without_gpu_says_why(pb):
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(BackendUnavailableError, match="numba"):
        _call(pb, backend="numba")
