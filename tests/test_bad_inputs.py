"""A battery of bad inputs and faults, through the CLI and the capture API, with outcomes counted.

Every case is classified as one of:

- ``typed``: refused as the contract says (exit 2 naming the file/key and a fix, or the documented
  exit code such as 1 "diverged" / 3 "keys missing"; a typed WorkbenchError through the API);
- ``raw``: an exception that is not a WorkbenchError escaped, or a traceback was printed;
- ``silent``: inconsistent data or a bad argument was accepted as if fine;
- ``lost``: a file that existed before the command is changed or gone.

The suite fails on any raw, silent or lost outcome. A seeded fuzzer of manifests and shard headers
(bounded in count and time) runs the same classification: a mutated capture is either refused with
a typed error, or every key, dtype, shape, seq and value read from it equals the original.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import random
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from workbench.capture import CaptureWriter, open_capture
from workbench.cli import main
from workbench.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[1]


def run_cli(argv):
    out, err = io.StringIO(), io.StringIO()
    exc = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:  # argparse usage errors
            rc = e.code
        except BaseException as e:  # noqa: BLE001 - classified below
            rc, exc = None, e
    return rc, out.getvalue(), err.getvalue(), exc


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))} if root.exists() else {}


def capture(path, arm="a", tensors=None, **kw):
    tensors = tensors if tensors is not None else {("o", "x", 0): torch.arange(128, dtype=torch.float32).view(8, 16),
                                                   ("o", "y", 1): torch.ones(4, dtype=torch.bfloat16)}
    with CaptureWriter(path, arm=arm, **kw) as w:
        for (op, name, layer), t in tensors.items():
            w.add(t, op=op, name=name, layer=layer)
    return path


def edit_manifest(path, fn):
    m = json.loads((path / "manifest.json").read_text())
    fn(m)
    (path / "manifest.json").write_text(json.dumps(m))
    return path


def _reread(path: Path) -> list:
    cap = open_capture(path)
    cap.verify()
    return [(k, row["seq"], row["dtype"], list(row["shape"]), t.clone())
            for (k, t), (_, row) in zip(cap, cap.index.iterrows())]


# -- the cases ---------------------------------------------------------------------------------
# each returns (argv, expected exit code, substrings stderr must hold, protected folder or None)

CASES = {}


def case(fn):
    CASES[fn.__name__] = fn
    return fn


@case
def shard_path_is_a_directory(t):
    c = capture(t / "c")
    (c / "sub").mkdir()
    edit_manifest(c, lambda m: m["shards"][0].update(path="sub"))
    return ["compare", c, c], 2, ["ShardError", "not a regular file", "fix:"], None


@case
def shard_path_is_dot(t):
    c = edit_manifest(capture(t / "c"), lambda m: m["shards"][0].update(path="."))
    return ["inspect", c], 2, ["ManifestError", "capture directory itself"], None


@case
def manifest_is_a_directory(t):
    (t / "c" / "manifest.json").mkdir(parents=True)
    return ["inspect", t / "c"], 2, ["ManifestError", "not a regular file"], None


@case
def manifest_nested_100k_levels(t):
    (t / "c").mkdir()
    (t / "c" / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    return ["inspect", t / "c"], 2, ["ManifestError", "nested too deep"], None


@case
def shape_with_a_dimension_of_1e30(t):
    def f(m):
        m["tensors"]["shape"][0] = [0, 10**30]
        m["tensors"]["nbytes"][0] = 0
    return ["compare", edit_manifest(capture(t / "c"), f), t / "c"], 2, ["ManifestError", "shape[0]"], None


@case
def shard_path_of_10k_characters(t):
    c = edit_manifest(capture(t / "c"), lambda m: m["shards"][0].update(path="a" * 10_000))
    return ["inspect", c], 2, ["ManifestError", "at most 1024 characters"], None


@case
def json_output_is_a_directory(t):
    c = capture(t / "c")
    (t / "out").mkdir()
    return ["compare", c, c, "--json", t / "out"], 2, ["--json", "is a directory"], t / "out"


@case
def json_output_in_a_missing_directory(t):
    c = capture(t / "c")
    return ["compare", c, c, "--json", t / "nowhere" / "r.json"], 2, ["does not exist"], None


@case
def import_folder_without_pattern(t):
    (t / "d").mkdir()
    torch.save(torch.ones(2), t / "d" / "a.pt")
    return ["import", "folder", t / "d", t / "out"], 2, ["ImporterError", "needs option(s) ['pattern']"], t / "d"


@case
def import_folder_with_empty_pattern(t):
    (t / "d").mkdir()
    torch.save(torch.ones(2), t / "d" / "a.pt")
    return ["import", "folder", t / "d", t / "out", "--pattern", ""], 2, ["ImporterError", "empty"], t / "d"


@case
def import_run_option_not_json(t):
    (t / "d").mkdir()
    torch.save(torch.ones(2), t / "d" / "x.0.y.pt")
    return (["import", "folder", t / "d", t / "out", "--pattern", "{op}.{layer}.{name}.pt", "-o", "run=abc"], 2,
            ["-o run must be a JSON object"], t / "d")


@case
def import_overwrite_onto_its_own_source(t):
    (t / "d").mkdir()
    torch.save(torch.ones(2), t / "d" / "x.0.y.pt")
    return (["import", "folder", t / "d", t / "d", "--pattern", "{op}.{layer}.{name}.pt", "-o", "overwrite=true"],
            2, ["the dump being imported"], t / "d")


@case
def import_into_a_folder_inside_the_source(t):
    (t / "d").mkdir()
    torch.save(torch.ones(2), t / "d" / "x.0.y.pt")
    return (["import", "folder", t / "d", t / "d" / "cap", "--pattern", "{op}.{layer}.{name}.pt"], 2,
            ["the dump being imported"], t / "d")


@case
def import_overwrite_of_a_model_folder(t):
    (t / "d").mkdir()
    torch.save(torch.ones(2), t / "d" / "x.0.y.pt")
    (t / "hf").mkdir()
    (t / "hf" / "model.safetensors").write_bytes(b"weights")
    (t / "hf" / "config.json").write_text("{}")
    return (["import", "folder", t / "d", t / "hf", "--pattern", "{op}.{layer}.{name}.pt", "-o", "overwrite=true"],
            2, ["does not look like a capture"], t / "hf")


@case
def npz_member_is_a_raw_pickle(t):
    import pickle
    import zipfile

    (t / "d").mkdir()
    with zipfile.ZipFile(t / "d" / "x.0.y.npz", "w") as z:
        z.writestr("a.npy", pickle.dumps({"evil": 1}))
    return (["import", "folder", t / "d", t / "out", "--pattern", "{op}.{layer}.{name}.npz"], 2,
            ["UnsafeFileError", "raw pickle"], t / "d")


@case
def run_out_is_a_file(t):
    (t / "f").write_text("keep")
    return ["run", ROOT / "notebooks" / "tour.ipynb", "--out", t / "f"], 2, ["--out", "is a file"], t


@case
def run_out_below_a_file(t):
    (t / "f").write_text("keep")
    return ["run", ROOT / "notebooks" / "tour.ipynb", "--out", t / "f" / "sub"], 2, ["is a file"], t


@case
def lone_surrogate_in_an_op_name(t):
    c = edit_manifest(capture(t / "c"), lambda m: m["tensors"]["op"].__setitem__(0, "o\ud800"))
    return ["inspect", c], 0, [], None


@case
def compare_arms_without_common_keys(t):
    a = capture(t / "a")
    b = capture(t / "b", tensors={("p", "z", 0): torch.ones(3)})
    return ["compare", a, b], 3, ["do not hold the same keys"], None


@case
def rule_with_nan_threshold(t):
    c = capture(t / "c")
    return ["compare", c, c, "--rule", "*:rel_l2=nan"], 2, ["threshold must be a finite number"], None


@case
def rule_with_inf_threshold(t):
    c = capture(t / "c")
    return ["compare", c, c, "--rule", "*:max_abs=inf"], 2, ["finite"], None


@case
def int64_one_apart_at_2_53(t):
    a = capture(t / "a", tensors={("ids", "x", 0): torch.tensor([2**53, 2**62], dtype=torch.int64)})
    b = capture(t / "b", tensors={("ids", "x", 0): torch.tensor([2**53 + 1, 2**62 + 1], dtype=torch.int64)})
    return ["compare", a, b], 1, [], None


@case
def zero_control_with_noisy_repeat_and_a_wild_candidate(t):
    a = capture(t / "a", tensors={("o", "x", 0): torch.zeros(64)})
    r = capture(t / "r", tensors={("o", "x", 0): torch.full((64,), 1e-9)})
    b = capture(t / "b", tensors={("o", "x", 0): torch.full((64,), 1e6)})
    return ["compare", a, b, "--aa", r], 1, [], None


@case
def dtype_relabelled_fp32_as_int32(t):
    c = edit_manifest(capture(t / "c"), lambda m: m["tensors"]["dtype"].__setitem__(0, "int32"))
    return ["compare", c, c], 2, ["ShardError", "disagree"], None


@case
def shape_transposed_with_the_same_bytes(t):
    c = edit_manifest(capture(t / "c"), lambda m: m["tensors"]["shape"].__setitem__(0, [16, 8]))
    return ["compare", c, c], 2, ["disagree"], None


@case
def offset_into_the_header(t):
    c = edit_manifest(capture(t / "c"), lambda m: m["tensors"]["offset"].__setitem__(0, 16))
    return ["compare", c, c], 2, ["disagree"], None


@case
def offset_into_the_next_tensor(t):
    c = capture(t / "c")
    edit_manifest(c, lambda m: m["tensors"]["offset"].__setitem__(1, m["tensors"]["offset"][0] + 8))
    return ["compare", c, c], 2, ["ManifestError", "overlap"], None


@case
def keys_swapped_between_two_tensors(t):
    def f(m):
        m["tensors"]["layer"][0], m["tensors"]["layer"][1] = m["tensors"]["layer"][1], m["tensors"]["layer"][0]
        m["tensors"]["name"][0], m["tensors"]["name"][1] = m["tensors"]["name"][1], m["tensors"]["name"][0]
    return ["verify", edit_manifest(capture(t / "c"), f)], 1, ["header disagrees"], None


@case
def layer_of_2_70(t):
    c = edit_manifest(capture(t / "c"), lambda m: m["tensors"]["layer"].__setitem__(0, 2**70))
    return ["inspect", c], 2, ["ManifestError", "2**63"], None


@case
def duplicate_json_object_keys(t):
    c = capture(t / "c")
    text = (c / "manifest.json").read_text()
    (c / "manifest.json").write_text(text.replace('"arm":"a"', '"arm":"a","arm":"b"', 1))
    return ["inspect", c], 2, ["duplicate JSON object key 'arm'"], None


@case
def header_claims_another_dtype_with_sha_updated(t):
    c = capture(t / "c")
    shard = c / "shard-00000.safetensors"
    raw = shard.read_bytes()
    (hl,) = struct.unpack("<Q", raw[:8])
    header = raw[8:8 + hl].replace(b'"F32"', b'"I32"', 1)
    data = raw[:8] + header + raw[8 + hl:]
    shard.write_bytes(data)
    edit_manifest(c, lambda m: m["shards"][0].update(sha256=hashlib.sha256(data).hexdigest()))
    return ["verify", c], 1, ["header disagrees"], None


@case
def truncated_shard(t):
    c = capture(t / "c")
    shard = c / "shard-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:-10])
    return ["compare", c, c, "--verify"], 2, ["ShardError", "truncated"], None


@case
def flipped_data_byte_with_checksum_on_read(t):
    c = capture(t / "c")
    shard = c / "shard-00000.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[-3] ^= 0x40
    shard.write_bytes(bytes(raw))
    return ["compare", c, c, "--verify"], 2, ["ChecksumError", "sha256"], None


def _classify(name, tmp_path):
    argv, want, needles, protected = CASES[name](tmp_path)
    before = snapshot(protected) if protected is not None else None
    rc, out, err, exc = run_cli(argv)
    if exc is not None or "Traceback" in err:
        return "raw", f"{type(exc).__name__ if exc else 'traceback'}: {exc or err[-400:]}"
    if protected is not None and {k: v for k, v in snapshot(protected).items() if k in before} != before:
        return "lost", f"{protected} changed"
    if rc != want:
        kind = "silent" if rc == 0 else "raw"
        return kind, f"exit {rc}, expected {want}; stderr: {err[-300:]!r}"
    if rc == 2 and not ("error:" in err and "fix:" in err):
        return "raw", f"exit 2 without a typed error and fix: {err[-300:]!r}"
    missing = [n for n in needles if n not in err + out]
    if missing:
        return "raw", f"message lacks {missing}: {err[-400:]!r}"
    return "typed", ""


def test_bad_input_battery(tmp_path):
    counts = {"typed": 0, "raw": 0, "silent": 0, "lost": 0}
    bad = []
    for name in CASES:
        d = tmp_path / name
        d.mkdir()
        kind, why = _classify(name, d)
        counts[kind] += 1
        if kind != "typed":
            bad.append(f"{name}: {kind}: {why}")
    print(f"\nbad-input battery: {len(CASES)} cases, " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    assert not bad, "\n".join(bad)


def test_piping_into_head_is_quiet(tmp_path):
    c = capture(tmp_path / "c", tensors={("o", f"n{i}", i): torch.ones(1) for i in range(3000)})
    for cmd in (["inspect", str(c), "--keys"], ["compare", str(c), str(c), "--rows", "3000"]):
        p = subprocess.run(f"{sys.executable} -m workbench.cli {' '.join(cmd)} | head -n 2", shell=True,
                           capture_output=True, text=True, cwd=ROOT)
        assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
        assert len(p.stdout.splitlines()) == 2


def test_api_refusals(tmp_path):
    with CaptureWriter(tmp_path / "c", arm="a") as w:
        with pytest.raises(WorkbenchError, match="meta-device"):
            w.add(torch.empty(3, device="meta"), op="o", name="m")
        w.add(torch.ones(1), op="o", name="tensor-tag", tensor="kept")
    assert open_capture(tmp_path / "c").index["tags"][0] == {"tensor": "kept"}


# -- the fuzzer ----------------------------------------------------------------------------------

EDGE = [-1, 0, 1, 7, 2**31, 2**53 + 1, 2**63, 2**70, -2**63 - 1, 1e308, 0.5, "", "x" * 1100, ".", "..",
        "/etc/passwd", [], {}, None, True, [0, 10**30], ["fp32"], "int32", "bf16", "\ud800"]


def _mutate_manifest(m: dict, rng: random.Random) -> str:
    m = json.loads(json.dumps(m))
    kind = rng.randrange(6)
    cols = m["tensors"]
    if kind == 0:  # a column entry replaced by an edge value
        c = rng.choice(list(cols))
        if cols[c]:
            cols[c][rng.randrange(len(cols[c]))] = rng.choice(EDGE)
    elif kind == 1:  # two entries of a column swapped
        c = rng.choice(list(cols))
        if len(cols[c]) > 1:
            i, j = rng.sample(range(len(cols[c])), 2)
            cols[c][i], cols[c][j] = cols[c][j], cols[c][i]
    elif kind == 2:  # a shard field replaced
        sh = rng.choice(m["shards"])
        sh[rng.choice(["path", "bytes", "sha256"])] = rng.choice(EDGE)
    elif kind == 3:  # an integer column nudged
        c = rng.choice(["rank", "step", "layer", "seq", "offset", "nbytes", "shard"])
        if cols[c]:
            i = rng.randrange(len(cols[c]))
            if type(cols[c][i]) is int:
                cols[c][i] += rng.choice([-8, -1, 1, 2, 8, 4096])
    elif kind == 4:  # a top-level field replaced or dropped
        k = rng.choice(list(m))
        if rng.random() < 0.5:
            del m[k]
        else:
            m[k] = rng.choice(EDGE)
    text = json.dumps(m, separators=(",", ":"))
    if kind == 5:  # text-level damage: a duplicated key, a cut, a stray byte
        r = rng.randrange(3)
        if r == 0:
            text = text.replace('"arm":', '"arm":"z","arm":', 1)
        elif r == 1:
            text = text[:rng.randrange(1, len(text))]
        else:
            i = rng.randrange(len(text))
            text = text[:i] + rng.choice(["\x00", "{", "]", "\\", "\ufffd"]) + text[i + 1:]
    return text


def _mutate_header(raw: bytes, rng: random.Random) -> bytes:
    """Damage the shard's header JSON (values or bytes), keeping the file otherwise as it was."""
    (hl,) = struct.unpack("<Q", raw[:8])
    header = raw[8:8 + hl]
    r = rng.randrange(4)
    if r == 0:
        for a, b in ((b'"F32"', b'"I32"'), (b'"BF16"', b'"F16"'), (b'"F32"', b'"F64"')):
            if a in header:
                header = header.replace(a, b, 1)
                break
    elif r == 1:
        h = json.loads(header)
        name = rng.choice([k for k in h if k != "__metadata__"])
        field = rng.choice(["shape", "data_offsets"])
        v = h[name][field]
        if v:
            v[rng.randrange(len(v))] += rng.choice([-1, 1, 4])
        header = json.dumps(h, separators=(",", ":")).encode().ljust(hl)[:hl]
    elif r == 2:
        i = rng.randrange(len(header))
        header = header[:i] + bytes([rng.randrange(256)]) + header[i + 1:]
    else:
        return struct.pack("<Q", hl + rng.choice([-9, -1, 1, 64, 2**40])) + raw[8:]
    return raw[:8] + header + raw[8 + hl:]


def test_fuzz_manifests_and_headers(tmp_path):
    rng = random.Random(20261201)
    src = capture(tmp_path / "src", shard_bytes=300, tensors={
        ("o", "x", 0): torch.arange(48, dtype=torch.float32).view(6, 8), ("o", "y", 1): torch.ones(4, dtype=torch.bfloat16),
        ("o", "z", 2): torch.arange(6, dtype=torch.int64), ("o", "e", 3): torch.zeros(0, 3),
        ("p", "x", 0): torch.full((70,), 0.25, dtype=torch.float64)})
    original = _reread(src)
    manifest = json.loads((src / "manifest.json").read_text())
    shards = {p.name: p.read_bytes() for p in src.glob("*.safetensors")}
    counts = {"typed": 0, "benign": 0, "raw": 0, "silent": 0}
    bad = []
    deadline = time.monotonic() + 25
    n = 0
    while n < 600 and time.monotonic() < deadline:
        n += 1
        d = tmp_path / f"m{n}"
        d.mkdir()
        for name, data in shards.items():
            (d / name).write_bytes(data)
        if rng.random() < 0.6:
            text = _mutate_manifest(manifest, rng)
            what = "manifest"
        else:  # a damaged header with the manifest's size and sha256 updated to match
            m = json.loads(json.dumps(manifest))
            sh = rng.choice(m["shards"])
            data = _mutate_header(shards[sh["path"]], rng)
            (d / sh["path"]).write_bytes(data)
            sh.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
            text = json.dumps(m)
            what = f"header of {sh['path']}"
        (d / "manifest.json").write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            got = _reread(d)
        except WorkbenchError:
            counts["typed"] += 1
            continue
        except Exception as e:  # noqa: BLE001
            counts["raw"] += 1
            bad.append(f"#{n} {what}: raw {type(e).__name__}: {e}")
            continue
        same = len(got) == len(original) and all(
            a[:4] == b[:4] and torch.equal(a[4], b[4]) for a, b in zip(got, original))
        if same:
            counts["benign"] += 1
        else:
            counts["silent"] += 1
            bad.append(f"#{n} {what}: accepted but reads differently")
    print(f"\nfuzzer: {n} mutations, " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    assert n >= 100
    assert not bad, "\n".join(bad[:20])
