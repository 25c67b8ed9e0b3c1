import importlib
import inspect

import pytest
import torch

from workbench.errors import KernelArgumentError
from workbench.kernels import backends
from workbench.kernels.gemm import splitk_matmul
from workbench.numerics import use_policy

MODULES = ["oracle", "torch_ref", "numba_cuda", "ext"]


def test_backends_share_keyword_signatures():
    expected = [p for n, p in inspect.signature(splitk_matmul).parameters.items() if n != "backend"]
    for m in MODULES:
        fn = importlib.import_module(f"workbench.kernels.gemm.{m}").splitk_matmul
        assert list(inspect.signature(fn).parameters.values()) == expected, m


def test_registry():
    assert set(backends("gemm").name) == {"oracle", "torch", "numba", "ext"}


def test_policy_supplies_defaults():
    x, w = torch.randn(2, 64), torch.randn(8, 64)
    with use_policy(splitk=4, partial_dtype="bf16"):
        a = splitk_matmul(x, w)
    assert torch.equal(a, splitk_matmul(x, w, splits=4, partial_dtype="bf16"))


@pytest.mark.parametrize("kw, arg", [
    (dict(w=torch.randn(8, 63)), "w"), (dict(x=torch.randn(2, 64).double()), "x"),
    (dict(x=torch.randn(2, 4, 64)), "x"), (dict(w=torch.randn(8, 64).bfloat16()), "w"),
    (dict(splits=0), "splits"), (dict(splits=65), "splits"), (dict(partial_dtype="fp8_e4m3"), "partial_dtype"),
    (dict(order="random"), "order"), (dict(out_dtype="fp64"), "out_dtype"),
], ids=["K-mismatch", "fp64-x", "3d-x", "dtype-mismatch", "zero-splits", "too-many-splits", "fp8-partials",
        "bad-order", "fp64-out"])
def test_bad_input(kw, arg):
    a = dict(x=torch.randn(2, 64), w=torch.randn(8, 64))
    a.update(kw)
    with pytest.raises(KernelArgumentError) as e:
        splitk_matmul(a.pop("x"), a.pop("w"), **a)
    assert e.value.key == arg
