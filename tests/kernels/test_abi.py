"""The native C ABI against its Python mirror: argument-struct layouts (size and every offset, as
the compiler laid them out), the dtype codes and the named status codes."""

from __future__ import annotations

import ctypes
import re

import pytest

from workbench.kernels import _abi, _native
from workbench.numerics.dtypes import NATIVE_CODES

ABI_H = _native.source_dir() / "common" / "wb_abi.h"
LIBS = {  # family: (sources per kind, structs)
    "gdn": ({"cpu": ["gdn/gdn_cpu.cpp"], "cuda": ["gdn/gdn_cuda.cu", "gdn/gdn_mma.cu"]}, [_abi.GdnArgs]),
    "gemm": ({"cpu": ["gemm/gemm_cpu.cpp"], "cuda": ["gemm/gemm_cuda.cu"]}, [_abi.SplitkArgs]),
    "qsa": ({"cpu": ["qsa/qsa_cpu.cpp"], "cuda": ["qsa/qsa_cuda.cu"]}, [_abi.QsaDecodeArgs, _abi.QsaMergeArgs]),
}


def _enum(name: str) -> dict[str, int]:
    body = re.search(rf"enum {name} \{{(.*?)\}};", ABI_H.read_text(), re.S).group(1)
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"(WB_\w+)\s*=\s*(-?\d+)", body)}


def _lib(family: str, kind: str) -> ctypes.CDLL:
    if kind == "cpu" and _native.find_cxx() is None:
        pytest.skip("needs a C++ compiler")  # CI has g++: scripts/setup.sh
    if kind == "cuda" and _native.find_nvcc() is None:
        pytest.skip("needs a CUDA GPU or at least nvcc; run on the GPU machine (see ../shared/GPU.md)")
    return _native.load(family, LIBS[family][0][kind], kind=kind)


@pytest.mark.parametrize("kind", ["cpu", "cuda"])
@pytest.mark.parametrize("family", sorted(LIBS))
def test_struct_layouts_match_the_compiled_ones(family, kind):
    lib = _lib(family, kind)
    for struct in LIBS[family][1]:
        want = [ctypes.sizeof(struct), *(getattr(struct, f).offset for f, _ in struct._fields_)]
        assert _abi.layout(lib, struct) == want, struct.__name__
        _abi.check_layout(lib, struct)  # what every launcher runs once per library


def test_a_drifted_mirror_is_refused():
    lib = _lib("gemm", "cpu")

    class SplitkArgs(ctypes.Structure):  # a field dropped: offsets shift
        _fields_ = [f for f in _abi.SplitkArgs._fields_ if f[0] != "stream"]

    with pytest.raises(Exception, match="differs from the ctypes mirror"):
        _abi.check_layout(lib, SplitkArgs)


def test_dtype_and_status_codes_are_one_table():
    assert _enum("WbDtype") == {f"WB_{k.upper()}": v for k, v in NATIVE_CODES.items()}
    assert {v: k for k, v in _enum("WbStatus").items()} == {**_abi.STATUS, 0: "WB_OK"}
    lib = _abi.bind(_lib("qsa", "cpu"), {"qsa_merge_cpu": _abi.QsaMergeArgs})
    for code, name in _abi.STATUS.items():
        assert lib.wb_status_name(code).decode() == ("ok" if code == 0 else name)


def test_a_refused_shape_is_a_named_status():
    import torch
    lib = _abi.bind(_lib("gemm", "cpu"), {"splitk_partials_cpu": _abi.SplitkArgs})
    a = _abi.SplitkArgs.of(x=torch.zeros(1, 4), w=torch.zeros(2, 4), parts=torch.zeros(2), M=1, N=2, K=4, S=0)
    rc = lib.splitk_partials_cpu(ctypes.byref(a))
    assert rc == -2
    err = _abi.status_error(lib, rc, "split-K CPU build")
    assert "WB_ERR_SHAPE (status -2)" in err.message
