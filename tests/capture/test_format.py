"""Fuzz the manifest parser: any damage gives a typed WorkbenchError, never another exception."""

import copy
import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.capture import CaptureWriter, open_capture
from workbench.capture.format import safe_join
from workbench.errors import FormatVersionError, ManifestError, UnsafePathError, WorkbenchError


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    p = tmp_path_factory.mktemp("fmt") / "cap"
    with CaptureWriter(p, arm="a", run={"m": 1}) as w:
        w.add(torch.ones(2, 3), layer=0, op="o", name="x")
        w.add(torch.zeros(4).bfloat16(), layer=1, op="o", name="y", tag="t")
    return p, json.loads((p / "manifest.json").read_text())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=6,
)


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value):
    for p in path[:-1]:
        obj = obj[p]
    if isinstance(obj, list) and not isinstance(path[-1], int):
        return
    obj[path[-1]] = value


def _open_with(p, text):
    (p / "manifest.json").write_text(text)
    try:
        cap = open_capture(p)
        for _, row in cap.index.iterrows():  # reading must fail cleanly too
            cap._tensor(row)
    except WorkbenchError:
        pass


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_manifest_fails_cleanly(valid, data):
    p, m = valid
    m = copy.deepcopy(m)
    paths = [q for q in _paths(m) if q]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        action = data.draw(st.sampled_from(["set", "delete"]))
        try:
            if action == "set":
                _set(m, path, data.draw(json_values))
            else:
                parent = m
                for q in path[:-1]:
                    parent = parent[q]
                del parent[path[-1]]
        except (KeyError, IndexError, TypeError):
            continue
        paths = [q for q in _paths(m) if q]
    _open_with(p, json.dumps(m))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_garbage_manifest_fails_cleanly(valid, text):
    p, _ = valid
    _open_with(p, text)


def test_specific_manifest_errors(valid, tmp_path):
    p, m = valid
    q = tmp_path / "c"
    q.mkdir()
    for f in p.iterdir():
        (q / f.name).write_bytes(f.read_bytes())
    cases = [
        ({**m, "version": 2}, FormatVersionError, "unsupported capture format version 2"),
        ({**m, "format": "other"}, FormatVersionError, "not a workbench capture"),
        ({**m, "tensors": {**m["tensors"], "nbytes": [1, 2]}}, ManifestError, "does not match shape"),
        ({**m, "tensors": {**m["tensors"], "dtype": ["fp32", "complex"]}}, ManifestError, "complex"),
        ({**m, "tensors": {**m["tensors"], "op": ["o"]}}, ManifestError, "has 1 entries"),
        ({**m, "tensors": {**m["tensors"], "dtype": [[], "fp32"]}}, ManifestError, "dtype"),  # found by the fuzzer
        ({**m, "shards": [{**m["shards"][0], "path": "/etc/passwd"}]}, UnsafePathError, "leaves"),
    ]
    for manifest, err, msg in cases:
        (q / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(err, match=msg):
            open_capture(q)
    (q / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="malformed manifest JSON"):
        open_capture(q)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=30))
def test_safe_join_never_escapes(tmp_path_factory, rel):
    root = tmp_path_factory.getbasetemp() / "root"
    root.mkdir(exist_ok=True)
    try:
        out = safe_join(root, rel, what="x")
    except (ManifestError, UnsafePathError):
        return
    assert root.resolve() in out.parents or out == root.resolve()
