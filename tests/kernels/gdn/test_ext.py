"""ext backend: its policy knobs, the CUDA path choice, the mma path's pieces, the CUDA source
compiled with nvcc when present, and the CUDA build run on the GPU (against the oracle on the
common cases: tests/kernels/test_conformance.py)."""

import pytest
import torch

import workbench
from workbench.errors import KernelArgumentError, PolicyError
from workbench.kernels import _native, gdn
from workbench.kernels.gdn import ext, oracle
from workbench.kernels.gdn._cases import case_id, make_inputs
from workbench.kernels.gdn._checks import l2norm
from workbench.kernels.registry import kernel_log
from workbench.numerics.policy import Policy

pytestmark = pytest.mark.skipif(_native.find_cxx() is None, reason="no C++ compiler")


def test_cpu_policy():
    x = make_inputs(1, 40, 1, 2, 16, 16, state=True, seed=8)
    ref_o, _ = oracle.recurrent(**x, qk_l2norm=True)
    e = lambda op, p: workbench.compare(ref_o, getattr(gdn, op)(**x, qk_l2norm=True,
                                                                 backend="ext", policy=p)[0]).rel_l2
    for op in ("recurrent", "chunked"):
        o32 = getattr(gdn, op)(**x, qk_l2norm=True, backend="ext", policy=Policy())[0]
        o64 = getattr(gdn, op)(**x, qk_l2norm=True, backend="ext", policy=Policy(accum_dtype="fp64"))[0]
        assert not torch.equal(o32, o64)  # the knob reaches the kernel
        # fp64 accumulation is clearly closer to the oracle (measured 9.4e-8 vs 1.5e-7 for recurrent)
        assert e(op, Policy(accum_dtype="fp64")) < 0.85 * e(op, Policy())
        assert e(op, Policy(input_dtype="bf16")) > 1e-4
    o, _ = gdn.chunked(**x, qk_l2norm=True, backend="ext", chunk_size=16,
                       policy=Policy(output_dtype="bf16"))
    assert o.dtype == torch.bfloat16 and workbench.compare(ref_o, o).rel_l2 < 5e-3
    with pytest.raises(PolicyError, match="state_dtype"):
        gdn.recurrent(**x, backend="ext", policy=Policy(state_dtype="bf16"))
    with pytest.raises(PolicyError, match="cuda_path"):  # the tensor-core path is CUDA's chunked form only
        gdn.chunked(**x, backend="ext", policy=Policy(cuda_path="mma"))


@pytest.mark.skipif(_native.find_nvcc() is None, reason="nvcc not found")
def test_cuda_source_compiles():
    # compiled, not run: the CI machine has nvcc but no GPU
    path = _native.build("gdn", ext.SOURCES["cuda"], kind="cuda", headers=ext.HEADERS)
    assert path.exists() and path.stat().st_size > 0


@pytest.mark.slow  # a whole nvcc compile of gdn_mma.cu with ptxas's report, uncached: about 50 s
@pytest.mark.skipif(_native.find_nvcc() is None, reason="nvcc not found")
def test_cuda_mma_kernels_keep_registers(tmp_path):
    """The mma path's prepare and the passes (every K, element type and block width) compile for
    sm_90 without local-memory spills (ptxas's report): the passes keep the state and their
    products in registers, and a spill would put them in local memory; shared memory is checked
    at compile time. The wgmma pass too, and ptxas serializes none of its wgmma (its C7517 /
    C7519 notes: a register touched between two wgmma of a group)."""
    import re
    import subprocess
    # the build's own nvcc command (flags, WORKBENCH_CUDA_ARCH), with ptxas's resource report
    cmd = _native._command("cuda", [_native.source_dir() / "gdn" / "gdn_mma.cu"], tmp_path / "m.so",
                           ["-Xptxas", "-v"])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    reports = re.findall(r"Compiling entry function '(\S+)'.*?(\d+) bytes spill stores", out, re.S)
    seen = {name for name, _ in reports
            if re.search(r"mma_(wpass|ppass|pass|prepare|wcpass)ILi(64|128)E|mma_wgpassI", name)}
    kinds = {kind: [n for n in seen if re.search(rf"mma_{kind}I", n)]
             for kind in ("prepare", "pass", "wpass", "ppass", "wgpass", "wcpass")}
    # prepare: K 64/128 x fp32/bf16/fp16, and K 64/128 bf16 writing Tinv and PT in bf16 halves
    # (for the wgmma passes); the shared-memory pass: the same at 32 and 16 value columns a block;
    # the warp-resident pass: 16-bit inputs at 2, 4 and 8 warps a block, fp32 at 2; the warp-pair
    # pass: 16-bit inputs at 1, 2 and 4 pairs a block; the wgmma pass: bf16, its block-barrier and
    # warp-specialised forms; the column wgmma pass: K 64/128 x 16/32 columns a block, copies
    # by a warp of their own or by the warpgroup
    assert [len(v) for v in kinds.values()] == [8, 12, 14, 12, 2, 8], sorted(seen)
    assert "C7517" not in out and "C7519" not in out, "ptxas serialized wgmma"
    spills = [(name, n) for name, n in reports if name in seen and int(n)]
    assert not spills, spills


@pytest.mark.skipif(_native.find_nvcc() is None, reason="nvcc not found")
def test_mma_packed_launch_tables():
    """A packed batch's launches on the mma path, as the CUDA build's host code builds them: at
    most 128 sequences a launch, token offsets those of cu_seqlens, each sequence's chunks counted
    from its own first token (ceil(length / 64)), and the workspace the Python side allocates
    (the most chunks of any one launch: launches reuse it) enough for every launch."""
    gen = torch.Generator().manual_seed(7)
    lengths = [int(x) for x in torch.randint(0, 200, (300,), generator=gen)]
    lengths[:3] = [0, 1, 64]
    lengths[128:131] = [65, 0, 128]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    launches = ext.mma_packed_launches(cu)
    assert [g["sequences"] for g in launches] == [128, 128, 44]
    assert [g["first"] for g in launches] == [0, 128, 256]
    total = sum(-(-n // 64) for n in lengths)
    for g in launches:
        i0, m = g["first"], g["sequences"]
        assert g["tok"] == cu[i0:i0 + m + 1]
        chk = [0]
        for n in lengths[i0:i0 + m]:
            chk.append(chk[-1] + -(-n // 64))
        assert g["chk"] == chk and g["chunks"] == chk[-1]
    assert launches[0]["chk"][:4] == [0, 0, 1, 2] and launches[1]["chk"][:4] == [0, 2, 2, 4]
    assert sum(g["chunks"] for g in launches) == total
    assert ext.mma_packed_workspace_chunks(cu) == max(g["chunks"] for g in launches) < total
    # one sequence; and a batch of empty sequences only (a launch of no chunks: nothing runs)
    assert ext.mma_packed_launches([0, 130]) == [{"first": 0, "sequences": 1, "tok": [0, 130], "chk": [0, 3],
                                                  "chunks": 3}]
    assert ext.mma_packed_launches([0, 0, 0])[0]["chunks"] == 0 == ext.mma_packed_workspace_chunks([0, 0, 0])
    assert ext.mma_packed_workspace_chunks([0, 130]) == 3
    # a chunk's workspace as the kernels lay it out (Tinv, PT, the passes' factor rows)
    assert ext.library("cuda").gdn_mma_chunk_workspace() == ext.MMA_CHUNK_WS == 8512


@pytest.mark.skipif(_native.find_nvcc() is None, reason="nvcc not found")
def test_mma_pass_plan(monkeypatch):
    """The launcher's choice of pass, asked of the CUDA build on the CPU (host code): the
    shared-memory pass below 2.5 warps an SM (B HV V / 16 warps), at 16 columns a block (smem16)
    where 32-column blocks would fill at most half the SMs (16-bit inputs), else the warp-resident
    pass with the fewest waves of blocks, then the fewest warps a block; 2 warps for float32
    inputs (shared memory) and for V = 32 / 96; WORKBENCH_GDN_MMA_PASS forces a pass."""
    monkeypatch.delenv("WORKBENCH_GDN_MMA_PASS", raising=False)
    bf16, f32 = torch.bfloat16, torch.float32
    cases = [  # (B, HV, V, dtype, SMs) -> pass
        ((1, 32, 128, bf16, 132), "smem"),    # 256 warps: 1.9 an SM
        ((1, 48, 128, bf16, 132), "warp4"),   # 384 warps: 2.9 an SM; 96 blocks of 4, one wave
        ((2, 32, 128, bf16, 132), "warp4"),   # 512 warps: 128 blocks of 4
        ((4, 32, 128, bf16, 132), "warp8"),   # 1024 warps: 128 blocks of 8
        ((8, 32, 128, bf16, 132), "warp8"),   # 256 blocks of 8, two waves (4 of 4-warp blocks)
        ((4, 32, 128, f32, 132), "warp2"),    # float32 q, k, v: 2 warps a block
        ((16, 32, 96, bf16, 132), "warp2"),   # V = 96: 32 columns a block
        ((32, 32, 32, bf16, 132), "warp2"),   # V = 32
        ((1, 32, 64, bf16, 132), "smem16"),   # K = V = 64 at B1: 64 blocks of 32 columns <= 66
        ((1, 33, 64, bf16, 132), "smem16"),   # 66 blocks: half the SMs
        ((1, 34, 64, bf16, 132), "smem"),     # 68 blocks: more than half
        ((1, 32, 64, f32, 132), "smem"),      # float32 inputs: 32 columns a block
        ((1, 4, 128, bf16, 132), "smem16"),   # 16 blocks
        ((1, 48, 128, bf16, 200), "smem"),    # more SMs: the same grid is below the threshold
        ((4, 16, 128, bf16, 1), "warp8"),     # one SM: the fewest waves are the largest blocks
    ]
    for (B, HV, V, dt, sms), want in cases:
        assert ext.mma_pass(B, HV, V, dt, sms=sms) == want, (B, HV, V, dt, sms)
    plans = {HV: ext.mma_pass(1, HV, 128, bf16, sms=132) for HV in range(1, 200)}
    assert [HV for HV, p in plans.items() if p == "smem16"] == list(range(1, 17))  # 4 HV <= 66
    assert [HV for HV, p in plans.items() if p == "smem"] == list(range(17, 42))
    # the warp-resident pass from 42: 42 x 8 = 336 warps >= 2.5 x 132 = 330 > 41 x 8
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", "warp")
    assert ext.mma_pass(1, 4, 128, bf16, sms=132) == "warp2"
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", "smem")
    assert ext.mma_pass(8, 32, 128, bf16, sms=132) == "smem" == ext.mma_pass(1, 4, 128, bf16, sms=132)
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", "smem16")  # forced: any grid or dtype
    assert ext.mma_pass(8, 32, 128, bf16, sms=132) == "smem16" == ext.mma_pass(1, 32, 64, f32, sms=132)
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", "pair")  # forced only; 16 columns a pair
    pair_cases = [
        ((1, 48, 128, bf16, 132), "pair8"),   # 96 blocks of 4 pairs: one wave
        ((1, 32, 128, bf16, 132), "pair4"),   # 128 blocks of 2 pairs: one wave (as 64 of 4)
        ((1, 32, 64, bf16, 132), "pair2"),    # 128 blocks of 1 pair: one wave
        ((4, 32, 96, bf16, 132), "pair4"),    # V = 96: 2 pairs (32 columns) a block at most
        ((4, 32, 128, f32, 132), "warp2"),    # float32 q, k, v: the warp-resident pass
    ]
    for (B, HV, V, dt, sms), want in pair_cases:
        assert ext.mma_pass(B, HV, V, dt, sms=sms) == want, (B, HV, V, dt, sms)
    # the wgmma passes, forced: bf16 q, k, v (the wgmma pass at K = V = 128 only); elsewhere the
    # shared-memory pass runs, and the plan says so
    fp16 = torch.float16
    wg_cases = [  # (pass forced, B, HV, K, V, dtype) -> pass
        (("wgmma", 1, 32, 128, 128, bf16), "wgmma"), (("wgmma", 8, 32, 128, 128, bf16), "wgmma"),
        (("wgmma", 1, 32, 64, 64, bf16), "smem"), (("wgmma", 1, 32, 128, 64, bf16), "smem"),
        (("wgmma", 1, 32, 128, 128, fp16), "smem"), (("wgmma", 1, 32, 128, 128, f32), "smem"),
        (("wgcols", 1, 32, 64, 64, bf16), "wgcols"), (("wgcols", 2, 8, 128, 96, bf16), "wgcols"),
        (("wgcols", 1, 32, 64, 64, fp16), "smem"), (("wgcols", 1, 32, 128, 128, f32), "smem"),
    ]
    for (p, B, HV, K, V, dt), want in wg_cases:
        monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", p)
        assert ext.mma_pass(B, HV, V, dt, sms=132, K=K) == want, (p, B, HV, K, V, dt)
    # other floating dtypes run as float32 (converted before the launch); integers are refused
    assert ext.mma_pass(1, 32, 128, torch.float64, sms=132, K=128) == "smem"
    with pytest.raises(ValueError, match="floating-point"):
        ext.mma_pass(1, 32, 128, torch.int32, sms=132)
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", "bogus")  # anything else: the rule
    assert ext.mma_pass(8, 32, 128, bf16, sms=132) == "warp8"


@pytest.mark.gpu
@pytest.mark.parametrize("op", ["recurrent", "chunked"])
def test_cuda_against_oracle(op):
    x = make_inputs(2, 200, 2, 4, 128, 64, dtype=torch.bfloat16, state=True, seed=9, device="cuda")
    ref_o, ref_s = oracle.chunked(**x, qk_l2norm=True)
    o, s = getattr(gdn, op)(**x, qk_l2norm=True, backend="ext")
    assert workbench.compare(ref_o, o).rel_l2 <= 5e-3
    assert workbench.compare(ref_s, s).rel_l2 <= 5e-3


# --- the tensor-core (mma) chunked path of the CUDA build ---------------------------------------

def _shape(K=128, V=128):
    from workbench.kernels.gdn._checks import check_gdn
    x = make_inputs(1, 3, 1, 2, K, V)
    return check_gdn(x["q"], x["k"], x["v"], x["g"], x["beta"], None, None)


def test_staged_l2norm_outside_the_mma_path():
    # CPU: q and k are normalized by the staging (float32); only the mma path normalizes itself
    x = make_inputs(1, 5, 1, 2, 8, 8, dtype=torch.bfloat16)
    st = ext.staged("chunked", **x, qk_l2norm=True)
    assert st.path == "scalar" and not st.qk_l2norm
    assert torch.equal(st.tensors[0], l2norm(x["q"].float())) and st.tensors[2].dtype == torch.float32
    o = torch.empty(1, 5, 2, 8)
    with pytest.raises(KernelArgumentError, match="qk_l2norm"):
        ext.launch("chunked", st.s, st.chunk, st.acc64, st.tensors, st.state.clone(), o,
                   qk_l2norm=True)
    ext.launch("chunked", st.s, st.chunk, st.acc64, st.tensors, st.state.clone(), o)
    ref, _ = gdn.chunked(**x, qk_l2norm=True, backend="ext", policy=Policy(output_dtype="fp32"))
    assert torch.equal(o, ref)


def test_cuda_path_choice(monkeypatch):
    # CPU: the launcher's path logic, no GPU needed
    monkeypatch.delenv("WORKBENCH_GDN_CUDA_PATH", raising=False)
    s = _shape()
    assert ext.cuda_path(s, 64, 0, torch.bfloat16) == "mma"
    assert ext.cuda_path(s, 64, 0, torch.float16) == "mma"
    assert ext.cuda_path(s, 64, 0, torch.float32) == "scalar"
    assert ext.cuda_path(s, 64, 0, None) == "scalar"
    assert ext.cuda_path(s, 32, 0, torch.bfloat16) == "scalar"   # chunk other than 64
    assert ext.cuda_path(s, 64, 1, torch.bfloat16) == "scalar"   # fp64 accumulators
    assert ext.cuda_path(_shape(K=32), 64, 0, torch.bfloat16) == "scalar"
    assert ext.cuda_path(_shape(V=48), 64, 0, torch.bfloat16) == "scalar"
    assert ext.cuda_path(_shape(K=64, V=32), 64, 0, torch.bfloat16) == "mma"
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "scalar")
    assert ext.cuda_path(s, 64, 0, torch.bfloat16) == "scalar"
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    assert ext.cuda_path(s, 64, 0, torch.float32) == "mma"
    with pytest.raises(PolicyError, match="chunk_size 64"):
        ext.cuda_path(_shape(K=32), 64, 0, torch.float32)
    # the policy's explicit choice wins; the environment replaces only its default 'auto'
    assert ext.cuda_path(s, 64, 0, torch.float32, "scalar") == "scalar"
    monkeypatch.delenv("WORKBENCH_GDN_CUDA_PATH")
    assert ext.cuda_path(s, 64, 0, torch.float32, "mma") == "mma"
    with pytest.raises(PolicyError, match=r"policy.cuda_path='mma'"):
        ext.cuda_path(_shape(K=32), 64, 0, torch.bfloat16, "mma")
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "fast")
    with pytest.raises(PolicyError, match="WORKBENCH_GDN_CUDA_PATH"):
        ext.cuda_path(s, 64, 0, torch.bfloat16)


def test_mma_diagonal_block_inverse_on_cpu():
    """The mma path's (I + A_II)^-1 for the 16 x 16 diagonal blocks (gdn_mma.h, shared with the
    CUDA prepare kernel) against fp64 inverses, on A built as the kernel builds it:
    beta_i (k_i . k_j) exp(gc_i - gc_j), j < i."""
    torch.manual_seed(0)
    n, C, K = 6, 64, 128
    k = torch.nn.functional.normalize(torch.randn(n, C, K, dtype=torch.float64), dim=-1)
    beta = torch.rand(n, C, 1, dtype=torch.float64)
    gc = torch.cumsum(-torch.rand(n, C, dtype=torch.float64) * 0.3, dim=1)
    A = (beta * (k @ k.transpose(1, 2)) * torch.exp(gc[:, :, None] - gc[:, None, :])).tril(-1)
    X = ext.inverse_diag16(A.float())
    for o in range(0, C, 16):
        blk = A.float().double()[:, o:o + 16, o:o + 16]
        ref = torch.linalg.inv(torch.eye(16, dtype=torch.float64) + blk)
        got = X[:, o:o + 16, o:o + 16].double()
        assert ((got - ref).norm() / ref.norm()) < 1e-6
        assert torch.equal(got.triu(1), torch.zeros_like(got))       # exactly lower triangular
        assert torch.equal(got.diagonal(dim1=1, dim2=2), torch.ones(n, 16, dtype=torch.float64))
    off = X.clone()
    for o in range(0, C, 16):
        off[:, o:o + 16, o:o + 16] = 0
    assert torch.equal(off, torch.zeros_like(off))                   # only the diagonal blocks
    with pytest.raises(KernelArgumentError, match="64, 64"):
        ext.inverse_diag16(torch.zeros(2, 32, 32))


MMA_CASES = [
    (2, 200, 2, 4, 128, 64, True),     # T not a multiple of 64, initial state
    (1, 77, 1, 2, 64, 128, False),     # K = 64, no state
    (1, 1, 2, 4, 128, 128, True),      # one step
    (1, 64, 1, 1, 128, 32, True),      # exactly one chunk
    (1, 1000, 16, 32, 128, 128, True), # the model's heads, odd T
    (1, 130, 1, 2, 64, 96, True),      # V = 96
    (2, 300, 2, 2, 64, 64, False),     # K = V = 64, batch 2
]


# the mma path's passes (the launcher picks one by the grid; forced here, each on every case):
# the warp-resident pass, the shared-memory pass, and (forced only) its 16-column blocks and the
# warp-pair pass (16-bit inputs; float32 ones take the warp-resident pass when it is forced)
PASSES = ["warp", "smem", "smem16", "pair"]


@pytest.mark.gpu
@pytest.mark.parametrize("mma_pass", PASSES)
@pytest.mark.parametrize("case", MMA_CASES, ids=[case_id(*c[:6], "bf16", c[6]) for c in MMA_CASES])
def test_cuda_mma_against_oracle(case, mma_pass, monkeypatch):
    monkeypatch.delenv("WORKBENCH_GDN_CUDA_PATH", raising=False)
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", mma_pass)
    *dims, state = case
    x = make_inputs(*dims, dtype=torch.bfloat16, state=state, seed=11, device="cuda")
    ref_o, ref_s = oracle.chunked(**x, qk_l2norm=True)
    o, s = gdn.chunked(**x, qk_l2norm=True, backend="ext")   # auto: mma for bf16 inputs
    co, cs = workbench.compare(ref_o, o), workbench.compare(ref_s, s)
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "scalar")
    o2, s2 = gdn.chunked(**x, qk_l2norm=True, backend="ext")
    print(f"\nmma {case}: o {co.rel_l2:.3e} state {cs.rel_l2:.3e}; scalar o "
          f"{workbench.compare(ref_o, o2).rel_l2:.3e} state {workbench.compare(ref_s, s2).rel_l2:.3e}")
    assert co.rel_l2 <= 5e-3 and cs.rel_l2 <= 5e-3
    # tf32 operands: within a small margin of the fp32 path
    assert workbench.compare(ref_s, s).rel_l2 <= 10 * workbench.compare(ref_s, s2).rel_l2 + 1e-3


@pytest.mark.gpu
def test_cuda_mma_writes_output_dtype(monkeypatch):
    """The mma kernel writes bf16/fp16 o itself: bit-equal to its float32 o rounded by torch."""
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    x = make_inputs(1, 150, 2, 4, 128, 128, dtype=torch.bfloat16, state=True, seed=13,
                    device="cuda")
    st = ext.staged("chunked", **x, qk_l2norm=True)       # as the API stages them
    s, tensors, state = st.s, st.tensors, st.state
    assert st.qk_l2norm                                   # the kernels normalize q and k
    outs = {}
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        outs[dt] = torch.full((s.B, s.T, s.HV, s.V), float("nan"), dtype=dt, device="cuda")
        ext.launch("chunked", s, 64, 0, tensors, state.clone(), outs[dt], path="mma",
                   qk_l2norm=True)
    assert torch.isfinite(outs[torch.float32]).all()
    assert torch.equal(outs[torch.bfloat16], outs[torch.float32].bfloat16())
    assert torch.equal(outs[torch.float16], outs[torch.float32].half())
    o, _ = gdn.chunked(**x, qk_l2norm=True, backend="ext")          # the API: bf16 from the kernel
    assert o.dtype == torch.bfloat16 and torch.equal(o, outs[torch.bfloat16])
    o16, _ = gdn.chunked(**x, qk_l2norm=True, backend="ext", policy=Policy(output_dtype="fp16"))
    assert o16.dtype == torch.float16 and torch.equal(o16, outs[torch.float16])
    with pytest.raises(KernelArgumentError, match="mma path writes"):
        ext.launch("chunked", s, 64, 0, tensors, state.clone(),
                   torch.empty(s.B, s.T, s.HV, s.V, dtype=torch.float64, device="cuda"),
                   path="mma")


@pytest.mark.gpu
@pytest.mark.parametrize("mma_pass", [p for p in PASSES if p != "pair"])  # pair: 16-bit only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("K,V,T", [(128, 128, 150), (64, 96, 64), (128, 32, 1)])
def test_cuda_mma_reads_16bit_inputs(dtype, K, V, T, mma_pass, monkeypatch):
    """bf16 / fp16 q, k, v read by the mma kernels as given: bit-equal to widening them first
    (they are exact in tf32), o and state; the API takes that path; mixed dtypes are refused."""
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", mma_pass)
    x = make_inputs(1, T, 2, 4, K, V, dtype=dtype, state=True, seed=17, device="cuda")
    # keys normalized by the caller (raw random keys make the recurrence blow up in float32)
    x["q"], x["k"] = (l2norm(x[n].float()).to(dtype) for n in ("q", "k"))
    st = ext.staged("chunked", **x)
    s, C, acc64, t16, state = st.s, st.chunk, st.acc64, st.tensors, st.state
    assert st.path == "mma" and not st.qk_l2norm and all(t.dtype == dtype for t in t16[:3])
    t32 = (*(t.float() for t in t16[:3]), *t16[3:])
    o16, o32 = (torch.full((s.B, s.T, s.HV, s.V), float("nan"), device="cuda") for _ in range(2))
    s16, s32 = state.clone(), state.clone()
    ext.launch("chunked", s, C, acc64, t16, s16, o16, path="mma")
    ext.launch("chunked", s, C, acc64, t32, s32, o32, path="mma")
    assert torch.isfinite(o16).all() and torch.equal(o16, o32) and torch.equal(s16, s32)
    o, st = gdn.chunked(**x, backend="ext", policy=Policy(output_dtype="fp32"))
    assert torch.equal(o, o16) and torch.equal(st, s16)
    ro, rs = gdn.chunked(**x, backend="oracle")
    assert workbench.compare(ro, o).rel_l2 <= 5e-3 and workbench.compare(rs, st).rel_l2 <= 5e-3
    with pytest.raises(KernelArgumentError, match="all three"):
        ext.launch("chunked", s, C, acc64, (t16[0], t32[1], *t16[2:]), state.clone(), o16,
                   path="mma")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("K,V,T", [(128, 128, 150), (64, 96, 200)])
def test_cuda_mma_l2norm_in_kernel(dtype, K, V, T, monkeypatch):
    """qk_l2norm on the mma path is applied by the kernels to the products of the raw q and k:
    close to normalizing q and k first (which rounds the normalized values to tf32), and both
    within the tolerance of the oracle."""
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    x = make_inputs(2, T, 2, 4, K, V, dtype=dtype, state=True, seed=21, device="cuda")
    f32 = Policy(output_dtype="fp32")
    o, st = gdn.chunked(**x, qk_l2norm=True, backend="ext", policy=f32)
    pre = {**x, "q": l2norm(x["q"].float()), "k": l2norm(x["k"].float()), "v": x["v"].float()}
    o_pre, st_pre = gdn.chunked(**pre, backend="ext", policy=f32)
    ro, rs = gdn.chunked(**x, qk_l2norm=True, backend="oracle")
    assert torch.isfinite(o).all() and torch.isfinite(st).all()
    assert workbench.compare(o_pre, o).rel_l2 <= 2e-3 and workbench.compare(st_pre, st).rel_l2 <= 2e-3
    assert workbench.compare(ro, o).rel_l2 <= 5e-3 and workbench.compare(rs, st).rel_l2 <= 5e-3
    assert ext.staged("chunked", **x, qk_l2norm=True).qk_l2norm


@pytest.mark.gpu
def test_cuda_mma_pass_choice(monkeypatch):
    """Unforced, the launcher takes the warp-resident pass on a grid of at least 2.5 warps an SM
    (2 B HV V / 16 >= 5 SMs), the shared-memory pass below, at 16 columns a block where 32-column
    blocks fill at most half the SMs: bit for bit the forced pass; the passes agree to float32
    rounding (the same roundings to tf32, sums in another order)."""
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for B, HV, want in ((1, 4, "smem16"), (1, 2 * (sms // 8) + 2, "smem"),
                        (-(-5 * sms // (2 * 32 * 8)), 32, "warp")):
        x = make_inputs(B, 130, 16 if HV == 32 else 2, HV, 128, 128, dtype=torch.bfloat16,
                        state=True, seed=5, device="cuda")
        out, noted = {}, {}
        for p in ("auto", "warp", "smem", "smem16"):
            monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", p)
            with kernel_log() as log:
                out[p] = gdn.chunked(**x, qk_l2norm=True, backend="ext")
            noted[p] = log.summary()[0]["path"]
            assert noted[p] == "mma/" + ext.mma_pass(B, HV, 128, torch.bfloat16)
        assert all(torch.equal(a, b) for a, b in zip(out["auto"], out[want])), (B, HV, want)
        assert noted["auto"].startswith(f"mma/{want}") and noted["smem"] == "mma/smem"
        assert all(torch.equal(a, b) for a, b in zip(out["smem"], out["smem16"]))
        assert workbench.compare(out["smem"][1], out["warp"][1]).rel_l2 <= 1e-5
        assert workbench.compare(out["smem"][0].float(), out["warp"][0].float()).rel_l2 <= 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("K,V", [(128, 128), (64, 64), (128, 96), (64, 32)])
def test_cuda_mma_smem16_is_smem_bit_for_bit(K, V, dtype, monkeypatch):
    """The shared-memory pass at 16 value columns a block splits each chunk's products over its
    warps differently but keeps every element's products, operands and order: o and the final
    state bit for bit those of the 32-column blocks (odd length, carried state, in-kernel norm)."""
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    x = make_inputs(2, 150, 2, 4, K, V, dtype=dtype, state=True, seed=23, device="cuda")
    out = {}
    for p in ("smem", "smem16"):
        monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", p)
        with kernel_log() as log:
            out[p] = gdn.chunked(**x, qk_l2norm=True, backend="ext")
        assert log.summary()[0]["path"] == f"mma/{p}"
    assert torch.isfinite(out["smem16"][0].float()).all()
    assert torch.equal(out["smem"][0], out["smem16"][0]) and torch.equal(out["smem"][1], out["smem16"][1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("K,V,T,B", [(128, 128, 150, 2), (64, 64, 200, 1), (128, 96, 64, 3), (64, 32, 1, 2),
                                     (128, 128, 1000, 1)])
def test_cuda_mma_pair_pass_agrees(K, V, T, B, dtype, monkeypatch):
    """The warp-pair pass (two warps a 16-column group, each half the state rows; forced) against
    the shared-memory pass, whose two chains over K / 2 it shares: the same roundings to tf32,
    the products transposed, so o and the state agree to float32 summation order; and both close
    to the oracle. Blocks of 1, 2 and 4 pairs (V = 32 .. 128), odd lengths, a length of 1."""
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    x = make_inputs(B, T, 2, 4, K, V, dtype=dtype, state=True, seed=29, device="cuda")
    out = {}
    for p in ("smem", "pair"):
        monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", p)
        with kernel_log() as log:
            out[p] = gdn.chunked(**x, qk_l2norm=True, backend="ext")
        assert log.summary()[0]["path"] == "mma/" + ext.mma_pass(B, 4, V, dtype)
    assert log.summary()[0]["path"].startswith("mma/pair")
    (o, s), (po, ps) = out["smem"], out["pair"]
    assert torch.isfinite(po.float()).all() and torch.isfinite(ps).all()
    assert workbench.compare(s, ps).rel_l2 <= 1e-5, workbench.compare(s, ps).rel_l2
    assert workbench.compare(o.float(), po.float()).rel_l2 <= 1e-3
    ro, rs = oracle.chunked(**x, qk_l2norm=True)
    assert workbench.compare(ro, po).rel_l2 <= 5e-3 and workbench.compare(rs, ps).rel_l2 <= 5e-3


@pytest.mark.gpu
@pytest.mark.parametrize("mma_pass", PASSES)
@pytest.mark.parametrize("split", [64, 100])
def test_cuda_mma_continuation(split, mma_pass, monkeypatch):
    """Prefill continuation on the mma path: [0:split] then [split:] with the state carried
    equals one call."""
    monkeypatch.setenv("WORKBENCH_GDN_CUDA_PATH", "mma")
    monkeypatch.setenv("WORKBENCH_GDN_MMA_PASS", mma_pass)
    x = make_inputs(1, 128 if split == 64 else 230, 2, 4, 128, 128, dtype=torch.bfloat16,
                    state=True, seed=12, device="cuda")
    o, s = gdn.chunked(**x, qk_l2norm=True, backend="ext")
    part = lambda a, b: {n: (t[:, a:b] if n != "initial_state" else t) for n, t in x.items()}
    o1, s1 = gdn.chunked(**part(0, split), qk_l2norm=True, backend="ext")
    o2, s2 = gdn.chunked(**{**part(split, None), "initial_state": s1}, qk_l2norm=True,
                         backend="ext")
    assert workbench.compare(o.float(), torch.cat([o1, o2], 1).float()).rel_l2 <= 5e-3
    # other chunk boundaries round differently in tf32 (each ~4e-4 from the oracle)
    assert workbench.compare(s, s2).rel_l2 <= (1e-5 if split == 64 else 2e-3)
