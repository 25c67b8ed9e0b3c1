"""Lazy xarray views of a capture: a BackendArray that reads only the tensors indexed."""

from __future__ import annotations

import itertools
import numpy as np
import xarray as xr
from xarray.backends import BackendArray
from xarray.core import indexing

from workbench.capture.format import KEY_FIELDS
from workbench.errors import CaptureError

_NUMPY_VIEW = {"bf16": np.float32, "fp16": np.float16, "fp8_e4m3": np.float32, "fp8_e5m2": np.float32,
               "fp32": np.float32, "fp64": np.float64, "int64": np.int64, "int32": np.int32,
               "int16": np.int16, "int8": np.int8, "uint8": np.uint8, "bool": np.bool_}


class _StackedArray(BackendArray):
    def __init__(self, cap, grid: np.ndarray, tshape: tuple, dtype: np.dtype):
        self.cap = cap
        self.grid = grid  # int array of row positions in cap.index (-1: absent) over the stacked dims
        self.tshape = tshape
        self.shape = grid.shape + tshape
        self.dtype = np.dtype(dtype)

    def __getitem__(self, key):
        return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.OUTER,
                                                  self._raw)

    def _raw(self, key):
        nd = self.grid.ndim
        gkey, tkey = key[:nd], key[nd:]
        sub = np.asarray(self.grid[gkey] if nd else self.grid)
        out_t = np.empty(self.tshape, dtype=np.uint8)[tkey].shape if tkey else self.tshape
        out = np.full(sub.shape + tuple(out_t), np.nan if self.dtype.kind == "f" else 0, dtype=self.dtype)
        for pos in itertools.product(*(range(s) for s in sub.shape)):
            r = int(sub[pos])
            if r < 0:
                continue
            t = self.cap._tensor(self.cap.index.iloc[r])
            arr = t.float().numpy() if t.dtype.is_floating_point and self.dtype == np.float32 else t.numpy()
            out[pos] = arr[tkey] if tkey else arr
        return out


def stacked_dataarray(cap, dims: tuple, *, name=None, dtype=None) -> xr.DataArray:
    idx = cap.index
    if len(idx) == 0:
        raise CaptureError("no tensors selected", file=cap.path, fix="loosen the filters")
    for d in dims:
        if d not in KEY_FIELDS:
            raise CaptureError(f"unknown dim {d!r}", file=cap.path, fix=f"dims must be among {KEY_FIELDS}")
    other = [f for f in KEY_FIELDS if f not in dims]
    multi = [f for f in other if idx[f].nunique() > 1]
    if multi:
        raise CaptureError(
            f"the selection varies along {multi} which are not dims; "
            f"values: { {f: sorted(idx[f].unique().tolist())[:6] for f in multi} }",
            file=cap.path, fix=f"filter those (e.g. {multi[0]}=...) or add them to dims",
        )
    shapes = {tuple(s) for s in idx["shape"]}
    if len(shapes) != 1:
        raise CaptureError(f"selected tensors have different shapes {sorted(shapes)[:4]}", file=cap.path,
                           fix="filter to tensors of one shape (for example one name and one op)")
    dts = set(idx["dtype"])
    tshape = shapes.pop()
    np_dtype = np.dtype(dtype) if dtype is not None else np.result_type(*[_NUMPY_VIEW[d] for d in dts])
    coords = {d: np.array(sorted(idx[d].unique())) for d in dims}
    grid = np.full(tuple(len(coords[d]) for d in dims), -1, dtype=np.int64)
    pos = {d: {v: i for i, v in enumerate(coords[d])} for d in dims}
    cols = [idx[d].to_numpy() for d in dims]
    for r in range(len(idx)):
        grid[tuple(pos[d][cols[j][r]] for j, d in enumerate(dims))] = r
    tdims = tuple(f"dim_{i}" for i in range(len(tshape)))
    var = xr.Variable(dims + tdims, indexing.LazilyIndexedArray(_StackedArray(cap, grid, tshape, np_dtype)))
    label = name or "/".join(str(idx[f].iloc[0]) for f in ("op", "name") if f not in dims)
    attrs = {"arm": cap.arm, "capture": str(cap.path), "source_dtype": ",".join(sorted(dts))}
    attrs.update({f: idx[f].iloc[0] for f in other})
    return xr.DataArray(var, coords=coords, name=label, attrs={k: (str(v) if not isinstance(v, (int, float, str)) else v)
                                                              for k, v in attrs.items()})
