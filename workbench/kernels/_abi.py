"""The ctypes side of the native kernels' C ABI (``kernels/common/wb_abi.h``).

Every entry point takes one argument struct by pointer (:class:`GdnArgs`, :class:`SplitkArgs`,
:class:`QsaDecodeArgs`, :class:`QsaMergeArgs`, mirrors of ``kernels/<family>/<family>_abi.h``)
and returns a status: ``WB_OK`` (0), a named negative :data:`STATUS` code, or, from a CUDA build,
a positive ``cudaError_t``. :func:`check_layout` compares a mirror with the library's own
``wb_layout_<Struct>`` (size and every field offset); :func:`status_error` turns a status into a
typed error that names it.
"""

from __future__ import annotations

import ctypes

from workbench.errors import BackendUnavailableError, KernelArgumentError

__all__ = ["GdnArgs", "SplitkArgs", "QsaDecodeArgs", "QsaMergeArgs", "STATUS", "WB_OK", "bind", "check_layout",
           "status_error", "layout"]

_P, _I, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float

WB_OK = 0
STATUS = {0: "WB_OK", -1: "WB_ERR_ARGUMENT", -2: "WB_ERR_SHAPE", -3: "WB_ERR_PATH", -4: "WB_ERR_SHARED_MEM"}


class _Args(ctypes.Structure):
    @classmethod
    def of(cls, **values) -> "_Args":
        """A struct with the given fields (tensors give their data pointer; others stay zero)."""
        bad = sorted(set(values) - {f for f, _ in cls._fields_})
        if bad:
            raise KernelArgumentError(f"{cls.__name__} has no field(s) {bad}", key=bad[0],
                                      fix=f"fields are {[f for f, _ in cls._fields_]}")
        a = cls()
        for k, v in values.items():
            setattr(a, k, v.data_ptr() if hasattr(v, "data_ptr") else v)
        return a


class GdnArgs(_Args):
    _fields_ = [*((n, _P) for n in ("q", "k", "v", "g", "beta", "o", "state", "gcum", "W", "U", "tinv", "nq", "nk",
                                    "stream")),
                *((n, _I) for n in ("B", "T", "H", "HV", "K", "V")), ("scale", _F),
                *((n, _I) for n in ("chunk", "acc64", "in_dtype", "o_dtype")), ("h0", _P),
                *((n, _I) for n in ("g_dtype", "beta_dtype", "qk_l2norm", "zero_state"))]


class SplitkArgs(_Args):
    _fields_ = [*((n, _P) for n in ("x", "w", "parts", "y", "stream")),
                *((n, _I) for n in ("M", "N", "K", "S", "dt", "part_dt", "order", "path"))]


class QsaDecodeArgs(_Args):
    _fields_ = [*((n, _P) for n in ("q", "k", "v", "idx", "bt", "o_parts", "lse_parts", "o", "lse", "stream")),
                *((n, _I) for n in ("mode", "B", "HQ", "HKV", "D", "ps", "max_pages", "L", "S", "P")),
                ("qscale", _F), *((n, _I) for n in ("dt", "prob_dt", "warps", "kernel"))]


class QsaMergeArgs(_Args):
    _fields_ = [*((n, _P) for n in ("o_parts", "lse_parts", "o", "lse", "stream")),
                *((n, _I) for n in ("rows", "S", "D"))]


def bind(lib: ctypes.CDLL, entries: dict[str, type[_Args]]) -> ctypes.CDLL:
    """Declare each entry point ``name -> struct`` of ``lib``: one struct pointer in, an int status out."""
    for name, struct in entries.items():
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.POINTER(struct)]
        fn.restype = ctypes.c_int
    lib.wb_status_name.argtypes = [ctypes.c_int]
    lib.wb_status_name.restype = ctypes.c_char_p
    return lib


def layout(lib: ctypes.CDLL, struct: type[_Args]) -> list[int]:
    """The library's own [size, offset of field 0, offset of field 1, ...] of ``struct``."""
    fn = getattr(lib, f"wb_layout_{struct.__name__}")
    fn.argtypes = [ctypes.c_int]
    fn.restype = ctypes.c_int64
    out, i = [], 0
    while (v := fn(i)) >= 0:
        out.append(int(v))
        i += 1
    return out


def check_layout(lib: ctypes.CDLL, struct: type[_Args]) -> None:
    """KernelArgumentError when the ctypes mirror and the compiled struct disagree."""
    want = [ctypes.sizeof(struct), *(getattr(struct, f).offset for f, _ in struct._fields_)]
    got = layout(lib, struct)
    if got != want:
        raise KernelArgumentError(f"{struct.__name__}: the compiled struct (size, offsets) {got} differs from the "
                                  f"ctypes mirror {want}", key=struct.__name__,
                                  fix="keep workbench/kernels/_abi.py in step with kernels/*/*_abi.h")


def status_error(lib: ctypes.CDLL, rc: int, what: str, fix: str = "") -> BackendUnavailableError:
    """The typed error of a failed call: the status's name (WB_ERR_SHAPE, cudaErrorInvalidValue, ...)."""
    name = STATUS.get(rc) or (lib.wb_status_name(rc) or b"?").decode()
    return BackendUnavailableError(f"{what} failed: {name} (status {rc})", key="backend",
                                   fix=fix or "see the status name; try backend='torch'")
