"""The CUDA mma path's kernels (kernels/gdn/gdn_mma.cu) run on the CPU under the host emulation
of CUDA (workbench.kernels.gdn.mma_emu): every pass, forced, against the oracle; the contracts the
GPU tests check bit for bit (16-column blocks, 16-bit inputs, packed batches) checked the same way
here; and the schedules that expose a missing barrier or a stage read before its copy landed
(warps drifting apart, copies landing at issue or at the wait) leave every result unchanged."""

from __future__ import annotations

import sys

import pytest
import torch

import workbench
from workbench.kernels import _native
from workbench.kernels.gdn import mma_emu, oracle
from workbench.kernels.gdn._cases import make_inputs, packed_inputs

pytestmark = pytest.mark.skipif(_native.find_cxx() is None, reason="no C++ compiler")

PASSES = ["smem", "smem16", "warp", "pair"]
CASES = [  # B, T, H, HV, K, V, dtype
    (1, 150, 2, 2, 128, 128, torch.bfloat16),
    (2, 70, 1, 2, 64, 96, torch.float16),
]


def run(x, mma_pass, monkeypatch, **kw):
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", mma_pass)
    return mma_emu.chunked(**x, qk_l2norm=True, **kw)


def same_bits_with(x, env, value, monkeypatch, mma_pass="smem"):
    """o and the final state (float32 o) of the kernels as they are and with ``env=value``: both
    finite and bit for bit the same. Returns the first."""
    want = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
    monkeypatch.setenv(env, value)
    got = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
    monkeypatch.delenv(env)
    assert torch.isfinite(want[0]).all() and torch.isfinite(want[1]).all()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (env, value)
    return want


@pytest.mark.parametrize("mma_pass", PASSES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"B{c[0]}T{c[1]}K{c[4]}V{c[5]}")
def test_emulated_pass_against_oracle(case, mma_pass, monkeypatch):
    B, T, H, HV, K, V, dt = case
    x = make_inputs(B, T, H, HV, K, V, dtype=dt, state=True, seed=11)
    o, s = run(x, mma_pass, monkeypatch)
    took = mma_emu.pass_of(B, HV, V, dt, K=K)
    assert took == mma_pass if mma_pass.startswith("smem") else took.startswith(mma_pass), took
    ro, rs = oracle.chunked(**x, qk_l2norm=True)
    assert o.dtype == dt and torch.isfinite(o.float()).all()
    # the GPU's figures: o 1.7e-3 (bf16 rounding of o itself), state 3e-4
    assert workbench.compare(ro, o).rel_l2 <= 5e-3 and workbench.compare(rs, s).rel_l2 <= 2e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("K,V", [(128, 64), (64, 32)])
def test_emulated_smem16_is_smem_bit_for_bit(K, V, dtype, monkeypatch):
    x = make_inputs(1, 130, 1, 2, K, V, dtype=dtype, state=True, seed=23)
    a, b = run(x, "smem", monkeypatch), run(x, "smem16", monkeypatch)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_emulated_prepare_per_key_head_is_per_value_head_bit_for_bit(packed, monkeypatch):
    """Prepare forms K K^T and Q K^T once for the value heads of a key head (three here, and two
    key heads): each value head's Tinv, PT and factor rows, and so o and the state, are the bits
    of a block of its own (WORKBENCH_GDN_MMA_PREPARE=value-head, the former grid)."""
    if packed:
        x = packed_inputs([0, 70, 1, 64], H=2, HV=6, K=64, V=32, dtype=torch.bfloat16, seed=41)
    else:
        x = make_inputs(2, 70, 2, 6, 64, 32, dtype=torch.bfloat16, state=True, seed=41)
    shared = same_bits_with(x, "WORKBENCH_GDN_MMA_PREPARE", "value-head", monkeypatch)
    # and the value heads differ (their decays and betas do): the test is not of one head repeated
    assert not torch.equal(shared[1][:, 0], shared[1][:, 1])


@pytest.mark.parametrize("mma_pass", ["smem", "smem16", "warp", "pair"])
def test_emulated_initial_state_read_where_it_lies(mma_pass, monkeypatch):
    """The passes read the initial state from h0 and write the final state to another tensor (the
    public call no longer copies the state first; the emulation's state starts as NaN, so an
    element not written shows): bit for bit the result of updating a copy in place, zeros
    (zero_state) those of a zero state, and the caller's tensor is left as it was."""
    from workbench.kernels.gdn import ext
    from workbench.kernels.gdn._launch import stage
    from workbench.numerics.policy import Policy

    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", mma_pass)
    x = make_inputs(2, 70, 1, 2, 64, 32, dtype=torch.bfloat16, state=True, seed=53)
    s0 = x["initial_state"].clone()
    o, s = mma_emu.chunked(**x, output_dtype=torch.float32)
    assert torch.equal(x["initial_state"], s0) and torch.isfinite(s).all()

    def in_place(initial):
        st, _, C, tensors, state, _ = stage("ext", x["q"], x["k"], x["v"], x["g"], x["beta"], None,
                                            initial, False, Policy(), None, widen=False)
        out = torch.empty(st.B, st.T, st.HV, st.V, dtype=torch.float32)
        ext.launch("chunked", st, C, 0, tensors, state, out, path="mma", lib=mma_emu.library())
        return out, state

    io, is_ = in_place(x["initial_state"])
    assert torch.equal(o, io) and torch.equal(s, is_)
    zo, zs = mma_emu.chunked(**{**x, "initial_state": None}, output_dtype=torch.float32)
    io, is_ = in_place(None)
    assert torch.equal(zo, io) and torch.equal(zs, is_) and not torch.equal(zs, s)


def test_emulated_packed_launch_of_only_empty_sequences_copies_their_states(monkeypatch):
    """A packed batch whose first launch (128 sequences) holds only empty ones: that launch has no
    chunk to prepare, and its pass still writes each empty sequence's final state (its initial
    one; zeros without one) into the new state tensor."""
    monkeypatch.setenv("WB_EMU_SMS", "8")
    x = packed_inputs([0] * 128 + [70, 3], H=1, HV=1, K=64, V=32, dtype=torch.bfloat16, seed=59)
    o, s = mma_emu.chunked(**x, output_dtype=torch.float32)
    assert torch.equal(s[:128], x["initial_state"][:128]) and torch.isfinite(s).all()
    alone = mma_emu.chunked(**{**x, "initial_state": x["initial_state"][128:],
                               "cu_seqlens": [0, 70, 73]}, output_dtype=torch.float32)
    assert torch.equal(o, alone[0]) and torch.equal(s[128:], alone[1])
    _, z = mma_emu.chunked(**{**x, "initial_state": None}, output_dtype=torch.float32)
    assert torch.equal(z[:128], torch.zeros_like(z[:128])) and torch.isfinite(z).all()


@pytest.mark.parametrize("packed", [False, True], ids=["batch", "packed"])
def test_emulated_substitution_shortcut_is_the_full_one(packed, monkeypatch):
    """Prepare's substitution writes the zero blocks above each warp's first identity block and
    that block's [X | 0] instead of forming them by products (the default): Tinv, PT and so o and
    the state are the bits of forming every block (WORKBENCH_GDN_MMA_SOLVE=full), also for chunks
    shorter than a 16-row block."""
    if packed:
        x = packed_inputs([0, 1, 70, 17, 64], H=1, HV=2, K=64, V=32, dtype=torch.bfloat16, seed=47)
    else:
        x = make_inputs(2, 130, 1, 2, 128, 32, dtype=torch.bfloat16, state=True, seed=47)
    same_bits_with(x, "WORKBENCH_GDN_MMA_SOLVE", "full", monkeypatch)


@pytest.mark.parametrize("mma_pass,packed", [("smem", False), ("smem", True), ("wgmma", False)])
def test_emulated_doubling_solve_is_the_substitutions_inverse(mma_pass, packed, monkeypatch):
    """Prepare's (I + A)^-1 by blocked doubling (WORKBENCH_GDN_MMA_SOLVE=doubling, forced only,
    not yet timed): o and the state as close to the oracle as with the substitution (the default)
    and within 2e-5 of its results (the same rounding points, other sums in the lower left
    quadrant), with chunks shorter than a 16-row block, an empty and a one-token sequence; with
    the wgmma pass, which reads Tinv as bf16 halves; and the same bits with warps drifting apart."""
    if packed:
        x = packed_inputs([0, 1, 70, 17, 64], H=1, HV=2, K=64, V=32, dtype=torch.bfloat16, seed=53)
    else:
        V = 128 if mma_pass == "wgmma" else 32
        x = make_inputs(1, 150, 1, 2, 128, V, dtype=torch.bfloat16, state=True, seed=53)
    ro, rs = oracle.chunked(**x, qk_l2norm=True)
    so, ss = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
    monkeypatch.setenv("WORKBENCH_GDN_MMA_SOLVE", "doubling")
    o, s = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert workbench.compare(so, o).rel_l2 <= 2e-5 and workbench.compare(ss, s).rel_l2 <= 2e-5
    for want, got, sub in ((ro, o, so), (rs, s, ss)):
        assert workbench.compare(want, got).rel_l2 <= 1.01 * workbench.compare(want, sub).rel_l2
    if not packed:
        monkeypatch.setenv("WB_EMU_SCHED", "skew")
        ko, ks = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
        assert torch.equal(ko, o) and torch.equal(ks, s)


@pytest.mark.parametrize("case", ["batch", "packed", "nine-heads"])
def test_emulated_prefetched_gates_are_the_loaded_gates(case, monkeypatch):
    """WORKBENCH_GDN_MMA_GATES=prefetch (forced only, not yet timed): prepare loads every value
    head's gates and beta once, with the keys and queries, instead of each value head's at its
    start; the same values, so o and the state keep their bits: three value heads a key head with
    a partial last chunk, a packed batch with an empty and a one-token sequence (its chunks'
    positions past a sequence's end read 0, not the next sequence's gates), and nine value heads a
    key head (over the 8 prefetched: each value head loads its own, as without the switch)."""
    if case == "packed":
        x = packed_inputs([0, 1, 70, 17, 64], H=1, HV=3, K=64, V=32, dtype=torch.bfloat16, seed=59)
    else:
        H, HV = (1, 9) if case == "nine-heads" else (2, 6)
        x = make_inputs(2, 150, H, HV, 64, 32, dtype=torch.bfloat16, state=True, seed=59)
    same_bits_with(x, "WORKBENCH_GDN_MMA_GATES", "prefetch", monkeypatch)


@pytest.mark.parametrize("mma_pass,packed", [("smem", False), ("smem", True), ("smem16", True),
                                             ("warp", True)])
def test_emulated_producer_warps_copy_what_the_warps_copied(mma_pass, packed, monkeypatch):
    """The passes' copies issued by warps launched for them (two, the default; one) land where and
    before the computing warps' own did (WORKBENCH_GDN_MMA_COPY=warps): o and the state bit for
    bit, with copies landing only when waited for (the emulation's default), so a copy not waited
    for before its barrier reads NaN (the emulated shared memory's fill), and with warps drifting
    apart."""
    if packed:
        x = packed_inputs([0, 70, 1, 130, 64], H=1, HV=2, K=64, V=32, dtype=torch.bfloat16, seed=43)
    else:
        x = make_inputs(2, 150, 1, 2, 128, 64, dtype=torch.bfloat16, state=True, seed=43)
    monkeypatch.setenv("WORKBENCH_GDN_MMA_COPY", "warps")
    want = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
    assert torch.isfinite(want[0]).all() and torch.isfinite(want[1]).all()
    for copy, sched in (("two", "skew"), ("producer", "")):
        monkeypatch.setenv("WORKBENCH_GDN_MMA_COPY", copy)
        monkeypatch.setenv("WB_EMU_SCHED", sched)
        got = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (copy, sched)


# (slow tier: 24 emulated runs; every emulated test of the everyday tier reads the same NaN fill)
@pytest.mark.slow
@pytest.mark.parametrize("mma_pass", PASSES)
def test_emulated_passes_read_only_the_triangles_they_copy(mma_pass, monkeypatch):
    """The passes copy Tinv and PT as their lower block triangles (load_tri): the six blocks above
    the diagonal keep the emulated shared memory's NaN fill, so a product that read one would not
    be finite. With the copies issued by the computing warps, by one producer warp and by two
    (each of load_tri's thread counts), warps drifting apart: o and the state finite, the same
    bits from every copying form, and at the oracle (a packed batch with a one-token sequence,
    K = 64; a batch at K = 128)."""
    x = packed_inputs([0, 70, 1, 130, 64], H=1, HV=2, K=64, V=32, dtype=torch.bfloat16, seed=47)
    y = make_inputs(1, 150, 1, 2, 128, 64, dtype=torch.bfloat16, state=True, seed=47)
    monkeypatch.setenv("WB_EMU_SCHED", "skew")
    for inputs in (x, y):
        ro, rs = oracle.chunked(**inputs, qk_l2norm=True)
        first = None
        for copy in ("warps", "producer", "two"):
            monkeypatch.setenv("WORKBENCH_GDN_MMA_COPY", copy)
            o, s = run(inputs, mma_pass, monkeypatch, output_dtype=torch.float32)
            assert torch.isfinite(o).all() and torch.isfinite(s).all(), copy
            if first is None:
                first = (o, s)
                assert workbench.compare(ro, o).rel_l2 <= 5e-3 and workbench.compare(rs, s).rel_l2 <= 2e-3
            assert torch.equal(o, first[0]) and torch.equal(s, first[1]), copy


@pytest.mark.parametrize("mma_pass", ["smem", "smem16", "warp"])
def test_emulated_16bit_inputs_equal_their_float32_widening(mma_pass, monkeypatch):
    """bf16 q, k, v read as given give the result of the same kernels fed float32 copies (exact
    in tf32); the warp-pair pass takes 16-bit inputs only."""
    x = make_inputs(1, 100, 2, 2, 128, 64, dtype=torch.bfloat16, state=True, seed=17)
    wide = {**x, **{n: x[n].float() for n in ("q", "k", "v")}}
    o16, s16 = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
    o32, s32 = run(wide, mma_pass, monkeypatch, output_dtype=torch.float32)
    assert torch.equal(o16, o32) and torch.equal(s16, s32)


def test_emulated_passes_agree(monkeypatch):
    """The warp-resident and warp-pair passes against the shared-memory pass: the same roundings,
    sums in another order (the GPU's figures: o about 1e-5, state below 1e-7)."""
    x = make_inputs(2, 130, 2, 2, 128, 128, dtype=torch.bfloat16, state=True, seed=5)
    o, s = run(x, "smem", monkeypatch, output_dtype=torch.float32)
    for p in ("warp", "pair"):
        po, ps = run(x, p, monkeypatch, output_dtype=torch.float32)
        assert workbench.compare(o, po).rel_l2 <= 5e-5 and workbench.compare(s, ps).rel_l2 <= 1e-6, p


def test_emulated_warp_pass_widths_are_one(monkeypatch):
    """WORKBENCH_GDN_MMA_PASS=warpN forces the warp-resident pass at N warps a block (the packed
    batches' A/Bs) where 16 N columns divide V, else the rule's pass; every width gives the same
    bits (each warp's 16 columns are formed alike whatever the block)."""
    x = make_inputs(1, 90, 1, 2, 64, 128, dtype=torch.bfloat16, state=True, seed=21)
    outs = {}
    for p in ("warp2", "warp4", "warp8"):
        monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", p)
        assert mma_emu.pass_of(1, 2, 128, torch.bfloat16, K=64) == p
        assert mma_emu.pass_of(1, 2, 128, torch.float32, K=64) == ("warp2" if p == "warp2" else "smem")
        outs[p] = run(x, p, monkeypatch, output_dtype=torch.float32)
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", "warp4")
    assert mma_emu.pass_of(1, 2, 96, torch.bfloat16, K=64) == "smem16"  # 64 columns do not divide 96
    for p, (o, s) in outs.items():
        assert torch.isfinite(o).all() and torch.equal(o, outs["warp2"][0]) and torch.equal(s, outs["warp2"][1]), p


def test_emulated_output_dtypes(monkeypatch):
    """The kernels write bf16 / fp16 o themselves: their float32 o rounded to nearest even."""
    x = make_inputs(1, 70, 1, 2, 64, 64, dtype=torch.bfloat16, state=True, seed=13)
    outs = {dt: run(x, "smem", monkeypatch, output_dtype=dt)[0]
            for dt in (torch.float32, torch.bfloat16, torch.float16)}
    assert torch.equal(outs[torch.bfloat16], outs[torch.float32].bfloat16())
    assert torch.equal(outs[torch.float16], outs[torch.float32].half())


@pytest.mark.parametrize("mma_pass", PASSES)
def test_emulated_packed_batch_equals_sequences_alone(mma_pass, monkeypatch):
    """One launch pair for the packed batch (empty, one-token, odd and chunk-sized sequences,
    each with its own state): every sequence bit for bit its result alone on the same pass."""
    lengths = [0, 1, 5, 67, 0, 130, 64]
    x = packed_inputs(lengths, H=1, HV=2, K=64, V=64, dtype=torch.bfloat16, seed=3)
    cu, h0 = x.pop("cu_seqlens"), x.pop("initial_state")
    o, s = run(x, mma_pass, monkeypatch, initial_state=h0, cu_seqlens=cu)
    assert s.shape == (len(lengths), 2, 64, 64)
    for i, (a, b) in enumerate(zip(cu[:-1], cu[1:])):
        xi = {n: t[:, a:b] for n, t in x.items()}
        oi, si = run(xi, mma_pass, monkeypatch, initial_state=h0[i:i + 1])
        assert torch.equal(oi, o[:, a:b]) and torch.equal(si[0], s[i]), i
    assert torch.equal(s[0], h0[0]) and torch.equal(s[4], h0[4])  # empty sequences: as given


def test_packed_width_follows_the_longest_sequence(monkeypatch):
    """A packed launch the rule gives the warp-resident pass takes the width of least estimated
    time over its sequences' lengths: the mixed batch of the benchmark (one sequence of 47 chunks
    among 2 to 32) 4 warps a block; even lengths the plain batches' width; forced passes, float32
    inputs and small grids as the plain rule; one plan per launch of 128 sequences."""
    from workbench.kernels.gdn import ext

    monkeypatch.delenv("WORKBENCH_GDN_MMA_PASS", raising=False)
    lib = mma_emu.library()

    def plan(lengths, HV=32, V=128, dtype=torch.bfloat16, K=128):
        cu = [0]
        for n in lengths:
            cu.append(cu[-1] + n)
        return ext.mma_packed_passes(cu, HV, V, dtype, 132, K=K, lib=lib)

    mixed = [1000, 3001, 500, 2048, 77]
    assert plan(mixed) == ["warp4"] and plan(mixed, K=64) == ["warp4"]
    assert plan(mixed, V=96) == ["warp2"]  # 64 columns do not divide 96
    for even in ([512] * 16, [256] * 64, [100] * 40, [3001] * 2):
        assert plan(even) == [mma_emu.pass_of(len(even), 32, 128, torch.bfloat16, 132)], even
    assert plan(mixed, dtype=torch.float32) == [mma_emu.pass_of(5, 32, 128, torch.float32, 132)]
    assert plan(mixed, HV=2) == [mma_emu.pass_of(5, 2, 128, torch.bfloat16, 132)]  # not the warp pass
    many = [60] * 127 + [4000] + [60] * 172  # a long sequence in the first launch only
    assert plan(many) == ["warp4", "warp8", "warp8"]
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", "warp8")
    assert plan(mixed) == ["warp8"]


@pytest.mark.parametrize("mma_pass", PASSES + ["wgcols"])
def test_emulated_packed_pass_order_changes_nothing(mma_pass, monkeypatch):
    """The packed pass's blocks taken longest sequence first (the default) or as launched
    (WORKBENCH_GDN_MMA_ORDER=given): the same bits, every sequence's state where it belongs
    (lengths out of order, ties, an empty and a one-token sequence; two column groups a head)."""
    lengths = [67, 1, 300, 0, 130, 300, 5]
    x = packed_inputs(lengths, H=1, HV=2, K=64, V=64, dtype=torch.bfloat16, seed=17)
    same_bits_with(x, "WORKBENCH_GDN_MMA_ORDER", "given", monkeypatch, mma_pass=mma_pass)


@pytest.mark.parametrize("mma_pass", PASSES)
def test_emulated_dependent_launch_changes_nothing(mma_pass, monkeypatch):
    """The dependent launch (the default: the pass launched to start beside prepare's last blocks,
    its copying threads waiting for prepare's end; lean blocks asking for more shared memory where
    the grid fits on the SMs): under the emulation, which runs the kernels one after another, the
    same bits as the ordinary launch (WORKBENCH_GDN_MMA_PDL=off), for a batch and a packed batch
    with empty sequences."""
    x = make_inputs(2, 150, 2, 4, 128, 64, dtype=torch.bfloat16, state=True, seed=5)
    same_bits_with(x, "WORKBENCH_GDN_MMA_PDL", "off", monkeypatch, mma_pass)
    p = packed_inputs([0, 1, 67, 0, 130], H=1, HV=2, K=64, V=64, dtype=torch.bfloat16, seed=9)
    same_bits_with(p, "WORKBENCH_GDN_MMA_PDL", "off", monkeypatch, mma_pass)


GUARDED = r"""
import ctypes, mmap, os, sys
import torch
from workbench.kernels.gdn import mma_emu
from workbench.kernels.gdn._cases import make_inputs, packed_inputs

libc = ctypes.CDLL(None)
keep = []


def guarded(t):
    # a copy of t whose last byte abuts a page with no access: a read past its end faults
    n, page = t.numel() * t.element_size(), mmap.PAGESIZE
    size = -(-n // page) * page
    buf = mmap.mmap(-1, size + page)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    assert libc.mprotect(ctypes.c_void_p(addr + size), ctypes.c_size_t(page), 0) == 0
    keep.append(buf)
    flat = torch.frombuffer(buf, dtype=t.dtype, count=size // t.element_size())
    out = flat[flat.numel() - t.numel():].view(t.shape)
    out.copy_(t)
    return out


for mma_pass in ("smem", "smem16", "warp", "pair"):
    os.environ["WORKBENCH_GDN_MMA_PASS"] = mma_pass
    x = make_inputs(1, 70, 1, 2, 64, 64, dtype=torch.bfloat16, state=True, seed=3)
    x = {n: guarded(t) for n, t in x.items()}
    o, s = mma_emu.chunked(**x, qk_l2norm=True)
    p = packed_inputs([0, 1, 67, 0, 70], H=1, HV=2, K=64, V=64, dtype=torch.bfloat16, seed=9)
    cu = p.pop("cu_seqlens")
    p = {n: guarded(t) for n, t in p.items()}
    o2, s2 = mma_emu.chunked(**p, cu_seqlens=cu, qk_l2norm=True)
    assert torch.isfinite(o.float()).all() and torch.isfinite(o2.float()).all(), mma_pass
print("ok")
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mmap / mprotect guard pages")
def test_emulated_passes_read_nothing_past_their_inputs():
    """Every pass, a batch and a packed batch, with each input (q, k, v, g, beta and the initial
    state) ending at a page that may not be read: no read past an input's end (it would fault;
    the warp-resident pass's copying warp read 16 floats past h0's last row until 2026-12-06)."""
    import subprocess
    r = subprocess.run([sys.executable, "-c", GUARDED], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stderr[-2000:])


@pytest.mark.parametrize("mma_pass", PASSES)
def test_emulated_schedules_change_nothing(mma_pass, monkeypatch):
    """Warps drifting apart between barriers (WB_EMU_SCHED=skew) and copies landing at issue
    (WB_EMU_CP=eager) instead of at the wait: a missing barrier or wait would show as another
    result (test_emulation_catches_mutants); blocks of 4 or 8 warps (one SM)."""
    monkeypatch.setenv("WB_EMU_SMS", "1")
    x = make_inputs(1, 200, 1, 2, 64, 64, dtype=torch.bfloat16, state=True, seed=7)
    base = run(x, mma_pass, monkeypatch)
    assert mma_emu.pass_of(1, 2, 64, torch.bfloat16) in ("smem", "smem16", "warp4", "pair8")
    monkeypatch.setenv("WB_EMU_SCHED", "skew")
    for cp in ("late", "eager"):
        monkeypatch.setenv("WB_EMU_CP", cp)
        o, s = run(x, mma_pass, monkeypatch)
        assert torch.equal(o, base[0]) and torch.equal(s, base[1]), cp


# each mutation removes what one pass's correctness needs: (source text, replacement, count);
# the copies are issued by the computing warps (WORKBENCH_GDN_MMA_COPY=warps) or by warps launched
# for them (the default), so each wait and barrier is taken out of both
MUTATIONS = [
    # the shared-memory pass waits for all but the newest copy group: this chunk's stage may not
    # have landed
    ("    else cp_wait<0>();\n    __syncthreads();  // this chunk's inputs and S are in place",
     "    else cp_wait<1>();\n    __syncthreads();  // mutant", 1),
    ("      if constexpr (M::lean) cp_wait<1>();\n      else cp_wait<0>();\n      __syncthreads();  // 1",
     "      if constexpr (M::lean) cp_wait<1>();\n      else cp_wait<1>();\n      __syncthreads();", 1),
    # its 16-column blocks (lean staging) do not wait for this chunk's Tinv and PT
    ("      if (n + 1 < sq.nc) cp_wait<1>();\n      else cp_wait<0>();\n", "", 1),
    ("        if (n + 1 < sq.nc) cp_wait<1>();\n        else cp_wait<0>();\n", "", 1),
    # the warp-resident and warp-pair passes copy the next stage before the block barrier: into
    # the buffer slower warps still read
    ("    cp_wait<0>();\n    __syncthreads();  // this chunk's stage is in place; every warp is done "
     "with the other one\n    WB_CLK(1);\n    if (n + 1 < sq.nc && !prod) issue(n + 1, All{}, tid);",
     "    cp_wait<0>();\n    if (n + 1 < sq.nc && !prod) issue(n + 1, All{}, tid);\n    __syncthreads();", 1),
    ("      cp_wait<0>();\n      __syncthreads();\n      if (n + 1 < sq.nc) issue(n + 1, Warp{}, lane);",
     "      cp_wait<0>();\n      if (n + 1 < sq.nc) issue(n + 1, Warp{}, lane);\n      __syncthreads();", 1),
    ("    cp_wait<0>();\n    __syncthreads();  // this chunk's stage is in place; every warp is done "
     "with the other one\n    if (n + 1 < sq.nc) issue(n + 1);",
     "    cp_wait<0>();\n    if (n + 1 < sq.nc) issue(n + 1);\n    __syncthreads();", 1),
    # the warp pair: the second half reads R^T before the first half has written it
    ("    pair_sync();  // R^T is in X; the second half is done with Y", "", 1),
]


def mutant_library(tmp_path, mutations):
    """The emulation's library built from gdn_mma.cu with the mutations applied (each (text,
    replacement, count) checked to occur count times)."""
    import ctypes
    import subprocess

    src = (_native.source_dir() / "gdn" / "gdn_mma.cu").read_text()
    for old, new, count in mutations:
        assert src.count(old) == count, old
        src = src.replace(old, new)
    (tmp_path / "gdn").mkdir()
    (tmp_path / "gdn" / "gdn_mma.cu").write_text(src)
    unit = (_native.source_dir() / "gdn" / "gdn_mma_emu.cpp").read_text()
    (tmp_path / "emu.cpp").write_text(unit)
    out = tmp_path / "mutant.so"
    cmd = _native._command("cpu", [tmp_path / "emu.cpp"], out, [f"-I{tmp_path}", "-O1"])
    # the mutant's directory first, so that "gdn/gdn_mma.cu" is the mutant
    cmd.insert(1, f"-I{tmp_path}")
    subprocess.run(cmd, check=True, capture_output=True)
    return mma_emu.library(ctypes.CDLL(str(out)))


@pytest.mark.slow
def test_emulation_catches_mutants(tmp_path, monkeypatch):
    """The schedules above are not vacuous: gdn_mma.cu with its copy waits and barriers taken out
    (those of the computing warps and of the warps launched to copy), built under the emulation,
    gives wrong results where the schedule exposes it (late copies for the missing waits, drifting
    warps for the early copy, any schedule for the missing pair barrier), whichever warps copy."""
    lib = mutant_library(tmp_path, MUTATIONS)
    monkeypatch.setenv("WB_EMU_SMS", "1")
    x = make_inputs(1, 200, 1, 2, 64, 64, dtype=torch.bfloat16, state=True, seed=7)
    ro, _ = oracle.chunked(**x, qk_l2norm=True)
    good = {p: run(x, p, monkeypatch)[0] for p in ("smem", "smem16", "warp", "pair")}
    for copy in ("warps", "two"):
        monkeypatch.setenv("WORKBENCH_GDN_MMA_COPY", copy)
        for p, sched, cp in (("smem", "lockstep", "late"), ("smem16", "lockstep", "late"),
                             ("warp", "skew", "eager"), ("pair", "lockstep", "late")):
            monkeypatch.setenv("WB_EMU_SCHED", sched)
            monkeypatch.setenv("WB_EMU_CP", cp)
            assert workbench.compare(ro, good[p]).rel_l2 <= 5e-3
            o = run(x, p, monkeypatch, lib=lib)[0]
            assert not torch.isfinite(o.float()).all() or workbench.compare(ro, o).rel_l2 > 1e-2, (p, copy)


GPU_PASSES = PASSES + ["wgmma", "wgcols"]


@pytest.mark.gpu
@pytest.mark.parametrize("mma_pass", GPU_PASSES)
def test_emulation_matches_the_gpu(mma_pass, monkeypatch):
    """The emulation against the kernels on the GPU, the same pass forced: equal to float32
    rounding (the tensor cores' sums and the device's expf round otherwise)."""
    from workbench.kernels import gdn
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    x = make_inputs(2, 150, 2, 2, 128, 128, dtype=torch.bfloat16, state=True, seed=31)
    eo, es = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
    go, gs = gdn.chunked(**{n: t.cuda() for n, t in x.items()}, qk_l2norm=True, backend="ext",
                         policy=workbench.Policy(output_dtype="fp32"))
    assert workbench.compare(eo, go.cpu()).rel_l2 <= 1e-4 and workbench.compare(es, gs.cpu()).rel_l2 <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("mma_pass", ["smem", "warp", "wgmma"])
def test_gpu_doubling_solve(mma_pass, monkeypatch):
    """Prepare's doubling solve on the GPU (WORKBENCH_GDN_MMA_SOLVE=doubling): the emulation's
    results to float32 rounding, within 2e-5 of the substitution's on the GPU and as close to the
    oracle."""
    from workbench.kernels import gdn
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", mma_pass)
    x = make_inputs(2, 150, 2, 2, 128, 128, dtype=torch.bfloat16, state=True, seed=37)
    ro, rs = oracle.chunked(**x, qk_l2norm=True)

    def on_gpu():
        o, s = gdn.chunked(**{n: t.cuda() for n, t in x.items()}, qk_l2norm=True, backend="ext",
                           policy=workbench.Policy(output_dtype="fp32"))
        return o.cpu(), s.cpu()
    so, ss = on_gpu()
    monkeypatch.setenv("WORKBENCH_GDN_MMA_SOLVE", "doubling")
    go, gs = on_gpu()
    eo, es = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
    assert workbench.compare(eo, go).rel_l2 <= 1e-4 and workbench.compare(es, gs).rel_l2 <= 1e-5
    assert workbench.compare(so, go).rel_l2 <= 2e-5 and workbench.compare(ss, gs).rel_l2 <= 2e-5
    for want, got, sub in ((ro, go, so), (rs, gs, ss)):
        assert workbench.compare(want, got).rel_l2 <= 1.01 * workbench.compare(want, sub).rel_l2


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True])
def test_gpu_prefetched_gates(packed, monkeypatch):
    """Prepare's prefetched gates on the GPU (WORKBENCH_GDN_MMA_GATES=prefetch): the same bits as
    each value head loading its own, three value heads a key head, with the solve either way."""
    from workbench.kernels import gdn
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    if packed:
        x = packed_inputs([0, 1, 700, 64, 0, 250], H=2, HV=6, K=64, V=64, dtype=torch.bfloat16,
                          seed=41)
    else:
        x = make_inputs(2, 150, 2, 6, 128, 128, dtype=torch.bfloat16, state=True, seed=41)
    x = {n: (t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in x.items()}
    for solve in ("short", "doubling"):
        monkeypatch.setenv("WORKBENCH_GDN_MMA_SOLVE", solve)
        monkeypatch.delenv("WORKBENCH_GDN_MMA_GATES", raising=False)
        want = gdn.chunked(**x, qk_l2norm=True, backend="ext")
        monkeypatch.setenv("WORKBENCH_GDN_MMA_GATES", "prefetch")
        got = gdn.chunked(**x, qk_l2norm=True, backend="ext")
        assert torch.isfinite(got[0].float()).all() and torch.isfinite(got[1]).all()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), solve


def gpu_batch_and_packed(B, T, H, HV, seed):
    """A function calling gdn.chunked (ext, the norms in the kernel) on a CUDA batch (K = V = 128,
    bf16, an initial state) and on a packed batch with empty and one-token sequences: both
    results."""
    from workbench.kernels import gdn
    x = {n: t.cuda() for n, t in make_inputs(B, T, H, HV, 128, 128, dtype=torch.bfloat16,
                                                state=True, seed=seed).items()}
    p = {n: (t.cuda() if isinstance(t, torch.Tensor) else t) for n, t in
         packed_inputs([0, 1, 700, 64, 0, 2500], H=4, HV=8, K=128, V=128, dtype=torch.bfloat16,
                       seed=17).items()}

    def both():
        return (gdn.chunked(**x, qk_l2norm=True, backend="ext"),
                gdn.chunked(**p, qk_l2norm=True, backend="ext"))
    return both


def graph_replayed(fn, times=1):
    """fn's results from a CUDA graph of it (captured after a warm-up call), replayed ``times``."""
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm-up outside the capture
        with torch.cuda.graph(graph, stream=stream):
            out = fn()
    for _ in range(times):
        graph.replay()
    torch.cuda.synchronize()
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("mma_pass", GPU_PASSES)
def test_gpu_dependent_launch(mma_pass, monkeypatch):
    """On the GPU, the pass launched to start beside prepare's last blocks (the default:
    programmatic dependent launch, its copying threads waiting for prepare's end) gives the bits
    of the ordinary launch (WORKBENCH_GDN_MMA_PDL=off), called eagerly and replayed from a CUDA
    graph, for a batch of several prepare waves and a packed batch with empty sequences."""
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", mma_pass)
    both = gpu_batch_and_packed(1, 3000, 16, 32, seed=13)
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PDL", "off")
    want = both()
    monkeypatch.delenv("WORKBENCH_GDN_MMA_PDL")
    got = both()
    replayed = graph_replayed(both, times=3)
    for w, g, r in zip(want, got, replayed):
        assert torch.isfinite(w[0].float()).all()
        assert torch.equal(w[0], g[0]) and torch.equal(w[1], g[1])
        assert torch.equal(w[0], r[0]) and torch.equal(w[1], r[1])


@pytest.mark.gpu
@pytest.mark.parametrize("K,V", [(64, 64), (128, 96)])
def test_emulated_wgcols_matches_the_gpu(K, V, monkeypatch):
    """The column wgmma pass's emulation against the GPU at K = V = 64 (16-column blocks) and
    K = 128, V = 96 with 32-column blocks (a grid past 132 SMs in 16-column blocks: 3 x 8 x 6),
    an initial state, the norms in the kernel, partial last chunks: equal to float32 rounding."""
    from workbench.kernels import gdn
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    B = 2 if K == 64 else 3
    x = make_inputs(B, 100, 2, 8, K, V, dtype=torch.bfloat16, state=True, seed=37)
    monkeypatch.setenv("WB_EMU_SMS", str(torch.cuda.get_device_properties(0).multi_processor_count))
    eo, es = run(x, "wgcols", monkeypatch, output_dtype=torch.float32)
    go, gs = gdn.chunked(**{n: t.cuda() for n, t in x.items()}, qk_l2norm=True, backend="ext",
                         policy=workbench.Policy(output_dtype="fp32"))
    assert workbench.compare(eo, go.cpu()).rel_l2 <= 1e-4 and workbench.compare(es, gs.cpu()).rel_l2 <= 1e-5


@pytest.mark.gpu
def test_gpu_wgmma_pass_forms_are_one(monkeypatch):
    """On the GPU, the wgmma pass warp-specialised (WORKBENCH_GDN_MMA_WG=ws) and with its two
    computing warpgroups taking turns (=pingpong) gives the bits of its block-barrier form (sync),
    for a batch (47 chunks, the last partial) and a packed batch with empty and one-token
    sequences, called eagerly and (pingpong) replayed from a CUDA graph."""
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", "wgmma")
    both = gpu_batch_and_packed(2, 3001, 4, 8, seed=19)
    want = both()
    for form in WG_FORMS:
        monkeypatch.setenv("WORKBENCH_GDN_MMA_WG", form)
        got = both()
        for w, g in zip(want, got):
            assert torch.isfinite(w[0].float()).all()
            assert torch.equal(w[0], g[0]) and torch.equal(w[1], g[1]), form
    for w, r in zip(want, graph_replayed(both)):
        assert torch.equal(w[0], r[0]) and torch.equal(w[1], r[1])


def benchmark_module(name: str):
    """benchmarks/<name>.py loaded as a module (the benchmarks are scripts, not a package)."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[3] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wu_form_model_tracks_the_kernels():
    """benchmarks/gdn_wu_form_accuracy.py compares forms of the recurrence on a torch model of the
    kernels' roundings: its tf32 rounding is cvt.rna's (ties away from zero), its model of today's
    form is far closer to the kernels' emulation than either is to FP64, and the W / u form it
    models lands near today's form (closer with u through Tinv diag(beta)), its bf16 storage far
    from it, and today's form with the state split into two bf16 halves keeps o and brings the
    state closer; the fused forms rank as the docs report."""
    wu = benchmark_module("gdn_wu_form_accuracy")
    ulp = 2.0 ** -10
    x = torch.tensor([1 + ulp / 2, -(1 + ulp / 2), 1 + ulp / 2 - 2 ** -23, 1 + 1.5 * ulp])
    assert wu.rt(x).tolist() == [1 + ulp, -(1 + ulp), 1.0, 1 + 2 * ulp]
    p = wu.problem(1, 300, 1, 2, 128, 64, seed=7)
    scale = 128 ** -0.5
    eo, es = mma_emu.chunked(**p, scale=scale, output_dtype=torch.float32)
    ro, rs = oracle.chunked(**p, scale=scale)
    got = {f: wu.model(f, p, scale) for f in wu.FORMS}
    e_o, e_s = wu.rel(eo, ro), wu.rel(es, rs)
    assert wu.rel(got["tinv"][0], eo) < 0.25 * e_o and wu.rel(got["tinv"][1], es) < 0.25 * e_s
    t_o, t_s = wu.rel(got["tinv"][0], ro), wu.rel(got["tinv"][1], rs)
    assert wu.rel(got["wu"][0], ro) < 1.3 * t_o and wu.rel(got["wu"][1], rs) < 1.3 * t_s
    assert wu.rel(got["wu-bf16"][0], ro) > 3 * t_o
    # u from the raw values through Tinv diag(beta): its dominant diagonal term exact (beta_i V_i),
    # closer to FP64 than today's form, W in bf16 or not
    for f in ("wu-tb", "wu-tb-wbf16"):
        assert wu.rel(got[f][0], ro) < 0.95 * t_o and wu.rel(got[f][1], rs) < 0.85 * t_s, f
    # the state and the update's operand as two bf16 halves (16 bits): o as today's, the state
    # closer (3.0e-4 -> 2.0e-4 here)
    b_o, b_s = wu.rel(got["tinv-bf16x2"][0], ro), wu.rel(got["tinv-bf16x2"][1], rs)
    assert b_o < 1.02 * t_o and b_s < 0.8 * t_s
    # a fused kernel of FlashInfer's shape: with its bf16 operands far from today's form (what the
    # H100 measured: state 2.2e-3 against 3.0e-4), with the update's, P U's, T's and V - K S's
    # operands as two bf16 halves the state far closer, and with the state's too o as well
    f_o, f_s = wu.rel(got["fused-bf16"][0], ro), wu.rel(got["fused-bf16"][1], rs)
    assert f_o > 5 * t_o and f_s > 5 * t_s
    assert wu.rel(got["fused-x2"][0], ro) < 1.2 * t_o and wu.rel(got["fused-x2"][1], rs) < 0.05 * t_s
    assert wu.rel(got["fused-x2s"][0], ro) < 0.05 * t_o
    # ... and with every product in tf32 as today's (wgmma's tf32 form)
    assert wu.rel(got["fused-tf32"][0], ro) < 1.3 * t_o and wu.rel(got["fused-tf32"][1], rs) < 1.3 * t_s


def test_pass_ab_variant_settings():
    """benchmarks/gdn_pass_ab.py's variants: a plain value sets --env's variable; VAR=v,VAR2=w
    sets those launcher variables (a combination timed beside its parts); anything but a
    WORKBENCH_ variable is refused before a GPU is touched."""
    ab = benchmark_module("gdn_pass_ab")
    assert ab._settings("WORKBENCH_GDN_MMA_PDL", "off") == {"WORKBENCH_GDN_MMA_PDL": "off"}
    both = "WORKBENCH_GDN_MMA_PDL=wait,WORKBENCH_GDN_MMA_COPY=warps"
    assert ab._settings("X", both) == {"WORKBENCH_GDN_MMA_PDL": "wait", "WORKBENCH_GDN_MMA_COPY": "warps"}
    with pytest.raises(SystemExit, match="PATH"):
        ab._settings("X", "PATH=/tmp")


def test_sass_mix_loop_is_the_one_with_the_products():
    """benchmarks/gdn_sass_mix.py's ``loop``: the kernel's loop with the most tensor-core products
    (a pass's chunk loop), not a longer loop without any (a copying warp's), and the largest loop
    where none has a product; an outer loop counts its inner loops' instructions once."""
    mix = benchmark_module("gdn_sass_mix")

    def insn(op, addr):
        return f"        /*{addr:04x}*/                   {op} ;"
    lines, addr = [".text.kern:"], 0

    def emit(*ops):
        nonlocal addr
        for op in ops:
            lines.append(insn(op, addr))
            addr += 16
    lines.append(".L_x_1:")  # the copying warp's loop: 6 instructions, no product
    emit("LDGSTS", "LDGSTS", "LDGSTS", "IADD3", "ISETP", "BRA `(.L_x_1)")
    lines.append(".L_x_2:")  # the chunk loop: 5 instructions, an inner loop of 2
    emit("HMMA")
    lines.append(".L_x_3:")
    emit("HMMA", "BRA `(.L_x_3)")
    emit("FADD", "BRA `(.L_x_2)")
    lines += [".text.plain:", ".L_x_4:"]
    emit("FADD", "FADD", "BRA `(.L_x_4)")
    lines.append(".L_x_5:")
    emit("FADD", "BRA `(.L_x_5)")
    loops = mix.main_loops("\n".join(lines))
    assert loops["kern"] == (5, 2) and loops["plain"] == (3, 0)


def test_pass_ab_times_the_shapes_named_first_first():
    """benchmarks/gdn_pass_ab.py with --only times the shapes in the order of the filters they
    match (K = V = 64 named first runs first, before a time limit can cut it); without, every
    shape, the largest grids first."""
    ab = benchmark_module("gdn_pass_ab")
    names = [r[0] for r in ab._shapes(["K64", "B1 T8192", "seqs"])]
    assert names[0] == "B1 T4096 H16 HV32 K64 V64" and names[1] == "B1 T8192 H16 HV32"
    assert len(names) == 5 and all("seqs" in n for n in names[2:])
    every = [r[0] for r in ab._shapes(None)]
    assert len(every) == len(ab.PREFILL) and every[-1] == "B1 T4096 H16 HV32 K64 V64"
    assert ab._shapes(["no such shape"]) == []


# ------------------------------------------------------------ the wgmma pass (forced only)

def test_emulated_wgmma_pass_against_oracle(monkeypatch):
    """The wgmma pass (WORKBENCH_GDN_MMA_PASS=wgmma: the state transposed in two warpgroups'
    accumulators, bf16 operands in two halves) under the emulation's wgmma model: closer to the
    oracle than the shared-memory pass (float32 o 2.7e-4 against 3.4e-4, the state 1.2e-5 against
    3.0e-4 when written), an initial state and the norms in the kernel, a partial last chunk."""
    x = make_inputs(1, 150, 2, 2, 128, 128, dtype=torch.bfloat16, state=True, seed=11)
    wgmma_pass_against_oracle(x, "wgmma", 128, monkeypatch)


def wgmma_pass_against_oracle(x, mma_pass, V, monkeypatch):
    """A wgmma pass (bf16 operands in two halves) on x (B1 HV2, bf16 inputs): the launcher takes
    it; its float32 o within 5e-4 and its state within 5e-5 of the oracle, both closer than the
    shared-memory pass's (the state over 5x); o in bf16 the rounding of its float32 o, the same
    state. Returns the float32 o and the state."""
    ro, rs = oracle.chunked(**x, qk_l2norm=True)
    o, s = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
    assert mma_emu.pass_of(1, 2, V, torch.bfloat16, K=x["k"].shape[-1]) == mma_pass
    so, ss = run(x, "smem", monkeypatch, output_dtype=torch.float32)
    eo, es = workbench.compare(ro, o).rel_l2, workbench.compare(rs, s).rel_l2
    assert eo <= 5e-4 and es <= 5e-5, (eo, es)
    assert eo < workbench.compare(ro, so).rel_l2 and es < workbench.compare(rs, ss).rel_l2 / 5
    ob, sb = run(x, mma_pass, monkeypatch)  # o in bf16, as the inputs
    assert ob.dtype == torch.bfloat16 and torch.equal(sb, s) and torch.equal(ob, o.bfloat16())
    return o, s


@pytest.mark.parametrize("mma_pass,K", [("wgmma", 128), ("wgcols", 64)])
def test_emulated_wgmma_passes_packed_are_sequences_alone(mma_pass, K, monkeypatch):
    """A packed batch with an empty and a one-token sequence through the wgmma pass and the column
    wgmma pass: each sequence's o and state the bits of the sequence alone; the empty one keeps
    its state."""
    x = packed_inputs([70, 0, 1, 129], H=1, HV=2, K=K, V=K, dtype=torch.bfloat16, seed=61)
    cu = x["cu_seqlens"]
    o, s = run(x, mma_pass, monkeypatch, output_dtype=torch.float32)
    assert torch.equal(s[1], x["initial_state"][1].float())
    for i in (0, 2, 3):
        a, e = cu[i], cu[i + 1]
        one = {n: t[:, a:e] for n, t in x.items() if n in ("q", "k", "v", "g", "beta")}
        oi, si = run({**one, "initial_state": x["initial_state"][i:i + 1]}, mma_pass, monkeypatch,
                     output_dtype=torch.float32)
        assert torch.equal(oi, o[:, a:e]) and torch.equal(si, s[i:i + 1]), i


WG_FORMS = ["ws", "pingpong"]


@pytest.mark.parametrize("form", WG_FORMS)
def test_emulated_wgmma_pass_forms_are_one(form, monkeypatch):
    """The wgmma pass warp-specialised (WORKBENCH_GDN_MMA_WG=ws: a third warpgroup issues the
    copies, the computing warpgroups meet only at the stages' named barriers) and with the two
    taking turns to issue their products (=pingpong) gives the bits of the block-barrier form, with
    the warps in lockstep and drifting apart with copies landing at issue (where a stage refilled
    before both warpgroups are done with it shows): a packed batch of a four-chunk sequence (each
    stage refilled), an empty one and a one-token one. Every arrival at a named barrier is matched
    (the emulation fails a block that leaves one pending)."""
    x = packed_inputs([230, 0, 1], H=1, HV=2, K=128, V=128, dtype=torch.bfloat16, seed=23)
    want = run(x, "wgmma", monkeypatch, output_dtype=torch.float32)
    assert torch.isfinite(want[0]).all() and torch.isfinite(want[1]).all()
    monkeypatch.setenv("WORKBENCH_GDN_MMA_WG", form)
    for sched, cp in (("lockstep", "late"), ("skew", "eager")):
        monkeypatch.setenv("WB_EMU_SCHED", sched)
        monkeypatch.setenv("WB_EMU_CP", cp)
        got = run(x, "wgmma", monkeypatch, output_dtype=torch.float32)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (form, sched, cp)


# the warp-specialised passes' producer (produce_stages: the wgmma pass's ws form, the column
# pass): it refills a stage before the consumers are done with it (shows with copies landing at
# issue), or tells them a stage is full before its copies have landed (shows with copies landing
# at the wait)
WG_MUTATIONS = {
    "early refill": ("    if (n >= 2) named_sync<N>(empty0 + st);\n    issue(n, st);\n",
                     "    issue(n, st);\n    if (n >= 2) named_sync<N>(empty0 + st);\n", "eager"),
    "full too soon": ("    cp_wait<0>();\n    wbmma::fence_async_smem();  // visible to wgmma (the async "
                      "proxy)\n    full(st);", "    full(st);", "late"),
}


@pytest.mark.slow
@pytest.mark.parametrize("mutant", list(WG_MUTATIONS))
def test_emulation_catches_wgmma_pass_mutants(mutant, tmp_path, monkeypatch):
    """test_emulated_wgmma_pass_forms_are_one's and the column pass's schedules are not vacuous
    for the producer's protocol: each mutant above gives another result under the schedule that
    exposes it, in both passes."""
    old, new, cp = WG_MUTATIONS[mutant]
    lib = mutant_library(tmp_path, [(old, new, 1)])
    x = packed_inputs([230, 0, 1], H=1, HV=2, K=128, V=128, dtype=torch.bfloat16, seed=23)
    for p in ("wgmma", "wgcols"):
        monkeypatch.delenv("WB_EMU_SCHED", raising=False)
        monkeypatch.delenv("WB_EMU_CP", raising=False)
        want = run(x, p, monkeypatch, output_dtype=torch.float32)
        monkeypatch.setenv("WORKBENCH_GDN_MMA_WG", "ws")
        monkeypatch.setenv("WB_EMU_SCHED", "skew")
        monkeypatch.setenv("WB_EMU_CP", cp)
        o = run(x, p, monkeypatch, output_dtype=torch.float32, lib=lib)[0]
        assert not torch.isfinite(o).all() or workbench.compare(want[0], o).rel_l2 > 1e-3, (mutant, p)


# ------------------------------------------------------- the column wgmma pass (forced only)

@pytest.mark.parametrize("K,V,sms", [(64, 64, 132), (128, 128, 132), (128, 96, 1)],
                         ids=["K64-bv16", "K128-bv16", "K128V96-bv32"])
def test_emulated_wgcols_pass_against_oracle(K, V, sms, monkeypatch):
    """The column wgmma pass (WORKBENCH_GDN_MMA_PASS=wgcols: the state untransposed in one
    warpgroup's accumulators, 16 or 32 value columns a block as the products' N, bf16 operands in
    two halves) under the emulation's wgmma model: closer to the oracle than the shared-memory
    pass (o, and the state by far), an initial state and the norms in the kernel, a partial last
    chunk; o in bf16 the rounding of its float32 o; the same bits with the warps drifting apart
    and copies landing at issue; 32-column blocks where 16-column ones would not fit on the SMs."""
    monkeypatch.setenv("WB_EMU_SMS", str(sms))
    x = make_inputs(1, 150, 1, 2, K, V, dtype=torch.bfloat16, state=True, seed=11)
    o, s = wgmma_pass_against_oracle(x, "wgcols", V, monkeypatch)
    monkeypatch.setenv("WB_EMU_SCHED", "skew")
    monkeypatch.setenv("WB_EMU_CP", "eager")
    os_, ss_ = run(x, "wgcols", monkeypatch, output_dtype=torch.float32)
    assert torch.equal(os_, o) and torch.equal(ss_, s)
    # the copies by the warpgroup itself instead of a warp of their own: the same bits
    monkeypatch.setenv("WORKBENCH_GDN_MMA_COPY", "warps")
    ow, sw = run(x, "wgcols", monkeypatch, output_dtype=torch.float32)
    assert torch.equal(ow, o) and torch.equal(sw, s)


def test_emulated_wgcols_pass_elsewhere_is_the_smem_pass(monkeypatch):
    """Forced with fp16 q, k, v (no bf16 wgmma operands), the launcher runs the shared-memory pass."""
    x = make_inputs(1, 70, 1, 2, 64, 64, dtype=torch.float16, state=True, seed=5)
    a, b = run(x, "wgcols", monkeypatch), run(x, "smem", monkeypatch)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("K,V,dtype", [(64, 64, torch.bfloat16), (128, 128, torch.float16)],
                         ids=["K64", "fp16"])
def test_emulated_wgmma_pass_elsewhere_is_the_smem_pass(K, V, dtype, monkeypatch):
    """Forced where it does not apply (K or V not 128, q, k, v not bf16), the launcher runs the
    shared-memory pass: the same bits."""
    x = make_inputs(1, 70, 1, 2, K, V, dtype=dtype, state=True, seed=5)
    a, b = run(x, "wgmma", monkeypatch), run(x, "smem", monkeypatch)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
