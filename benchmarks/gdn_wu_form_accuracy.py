"""Accuracy against FP64 of two forms of the GDN chunk recurrence with the mma path's roundings,
modelled in torch on the CPU, before either is built as a kernel.

    python benchmarks/gdn_wu_form_accuracy.py --out benchmarks/results/gdn-wu-form-accuracy-YYYY-MM-DD.json

Both forms round what a tensor-core kernel feeds its tf32 products (round to nearest, ties away,
10-bit mantissa, as cvt.rna) and keep sums, decays and the state in float32:

- ``tinv`` (today's kernels): per chunk R = beta (V - exp(gc) K S), U = Tinv R,
  o = scale (exp(gc) Q S + PT R), S <- exp(gc_last) S + K^T (exp(gc_last - gc) U); Tinv, P, PT,
  R, the state as an operand and the decayed U rounded to tf32.
- ``wu``: Tinv taken out of the loop: W = Tinv (beta exp(gc) K) and u = Tinv (beta V) formed once
  a chunk, U = u - W S, o = scale (exp(gc) Q S + P U); W, P, beta V, U as an operand, the state
  as an operand and the decayed U rounded to tf32, u kept in float32.
- ``wu-bf16``: the same with W, u and U stored in bf16 (what fla keeps), for scale.
- ``wu-tb``: u formed from the raw values as ``u = TB V + beta V`` with ``TB = Tinv diag(beta)``
  below its diagonal rounded to tf32 (a C x C operand the pass reads in Tinv's place, V exact in
  tf32) and the diagonal's ``beta_i V_i`` added in float32, W in tf32.
- ``wu-tb-wbf16``: the same with W stored in bf16 (half its bytes), U still rounded to tf32 (what
  the kernels' W / u form ran: built as an A/B variant on 2026-12-06, 25-35% slower on the H100,
  removed; docs/kernels/gdn.md).
- ``tinv-bf16x2``: today's form with the state (the B operand of K S and Q S) and the update's
  decayed U (its A operand) each split into two bf16 halves, ``hi = bf16(x)``,
  ``lo = bf16(x - hi)`` (16 significant bits instead of tf32's 11), as bf16 ``mma.m16n8k16``
  would take them against the keys and queries, which are bf16 already (no conversion); Tinv R
  and PT R stay tf32.
- ``fused-bf16``: FlashInfer's fused SM90 kernel's roundings (read from its source, 0.7.4): every
  product's operands in bf16: the state (as the operand of ``K S`` and ``Q S``), ``V - exp(gc) K S``
  (bf16 arithmetic on bf16 V), ``T = Tinv diag(beta)``, the decayed masked ``Q K^T`` (P) and
  ``U = T (V - ...)`` (as the operand of o's intra-chunk product ``P U``, then decayed and rounded
  again as the update's operand against K); accumulators and the state in float32. Its inverse is
  modelled as formed in float32 and rounded once (FlashInfer's blockwise doubling rounds its
  intermediates too). It calibrates the model against a kernel measured on the GPU
  (``gdn-flashinfer-h100-2026-12-06-accuracy-kernels.json``).
- ``fused-ud2``, ``fused-ud2-o2``, ``fused-x2``: the same kernel with some operands as two bf16
  halves (``hi = bf16(x)``, ``lo = bf16(x - hi)``; each split costs that product a second or
  third bf16 MMA): the update's operand; also P and U in ``P U``; also T and ``V - K S`` (formed
  in float32) in ``T (V - K S)``; ``fused-x2s`` also the state in ``K S`` and ``Q S``;
  ``fused-tf32`` every product in tf32 (wgmma's tf32 form: the keys, queries and values exact in
  it, the rest rounded as today's kernels round them). Which of
  FlashInfer's roundings a fused kernel would have to avoid to keep our accuracy (``FUSED``
  below).

Each form's o is also reported rounded to bf16 (``o_bf16``), as the kernels return it for bf16
inputs: that rounding dominates o's error for the closer forms.

Each shape runs with beta representable in bf16 (as engines and the tests pass it), K = V = 128
also with beta in float32 (not exact in tf32) and with gates a tenth of make_inputs' (mean -0.018
a step, about e^-1.2 a chunk instead of e^-11: with make_inputs' gates a chunk nearly forgets the
state it started from, so the state's own rounding in ``K S`` weighs little; slow gates weigh it).

The model is checked against the CPU emulation of the real kernels (``mma_emu``) on a smaller
problem: ``tinv``'s distance to the emulation is reported next to its distance to FP64, and must
be far smaller for the comparison of the forms to mean anything. Matrix products here are CPU
float32 BLAS sums (their order is the CPU's), so the figures are for the roundings, which
dominate; they are not the kernels' bits.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workbench  # noqa: E402
from workbench.kernels.gdn import oracle  # noqa: E402
from workbench.kernels.gdn._cases import make_inputs  # noqa: E402
from workbench.numerics.portable import cpu_name  # noqa: E402

C = 64
FORMS = ("tinv", "wu", "wu-bf16", "wu-tb", "wu-tb-wbf16", "tinv-bf16x2", "fused-bf16", "fused-ud2",
         "fused-ud2-o2", "fused-x2", "fused-x2s", "fused-tf32")
# the fused forms: how each operand is rounded (bf: bf16; x2: two bf16 halves; tf: tf32; f32: not
# rounded):
# S the state in K S and Q S, SK the product K S before V - K S, VMS V - K S, T = Tinv diag(beta),
# P the decayed masked Q K^T, U in P U (and before the update's decay), UD the update's operand
_FI = {"S": "bf", "SK": "bf", "VMS": "bf", "T": "bf", "P": "bf", "U": "bf", "UD": "bf"}
FUSED = {"fused-bf16": _FI,
         "fused-ud2": {**_FI, "UD": "x2"},
         "fused-ud2-o2": {**_FI, "UD": "x2", "P": "x2", "U": "x2"},
         "fused-x2": {**_FI, "UD": "x2", "P": "x2", "U": "x2", "T": "x2", "SK": "f32", "VMS": "x2"}}
FUSED["fused-x2s"] = {**FUSED["fused-x2"], "S": "x2"}
FUSED["fused-tf32"] = {n: "tf" for n in _FI} | {"SK": "f32"}


def rt(x: torch.Tensor) -> torch.Tensor:
    """float32 to nearest tf32, ties away from zero (cvt.rna.tf32.f32), as float32."""
    b = x.float().contiguous().view(torch.int32)
    return ((b + 0x1000) & ~0x1FFF).view(torch.float32)


def bf(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def bf2(x: torch.Tensor) -> torch.Tensor:
    """x as two bf16 halves, hi = bf16(x), lo = bf16(x - hi), summed (16 significant bits)."""
    hi = bf(x)
    return hi + bf(x - hi)


def chunk_mats(k, q, g, beta, rnd=None):
    """One chunk of one head (float32 [L, K] keys / queries, [L] gates and beta): gc, Tinv (tf32,
    lower, unit diagonal) and P (tf32, lower with the diagonal), as prepare forms them (rnd: the
    rounding of Tinv and P instead of tf32's; ``lambda x: x`` keeps them float32)."""
    rnd = rnd or rt
    L = k.shape[0]
    gc = torch.cumsum(g, 0)
    dec = torch.exp(gc[:, None] - gc[None, :])
    low = torch.tril(torch.ones(L, L, dtype=torch.bool), -1)
    a = torch.where(low, beta[:, None] * (k @ k.T) * dec, torch.zeros((), dtype=torch.float32))
    eye = torch.eye(L, dtype=torch.float32)
    tinv = rnd(torch.linalg.solve_triangular(eye + a, eye, upper=False, unitriangular=True))
    p = rnd(torch.where(low | torch.eye(L, dtype=torch.bool), (q @ k.T) * dec,
                       torch.zeros((), dtype=torch.float32)))
    return gc, tinv, p


def run_form(form, q, k, v, g, beta, s0, scale):
    """One head: q, k [T, K], v [T, V], g, beta [T] (float32), s0 [K, V]; returns o, S."""
    T = q.shape[0]
    S = s0.clone()
    o = torch.empty(T, v.shape[1], dtype=torch.float32)
    for t0 in range(0, T, C):
        sl = slice(t0, min(t0 + C, T))
        kc, qc, vc, bc = k[sl], q[sl], v[sl], beta[sl]
        if form in FUSED:  # a fused kernel of FlashInfer's shape, bf16 products
            r = {n: {"bf": bf, "x2": bf2, "tf": rt, "f32": lambda t: t}[m] for n, m in FUSED[form].items()}
            gc, tinv, p = chunk_mats(kc, qc, g[sl], bc, rnd=lambda t: t)
            eg, gl = torch.exp(gc)[:, None], gc[-1]
            sb = r["S"](S)
            vms = r["VMS"](vc - r["SK"](eg * (kc @ sb)))
            ur = r["U"](r["T"](tinv * bc[None, :]) @ vms)
            o[sl] = scale * (eg * (qc @ sb) + r["P"](p) @ ur)
            S = torch.exp(gl) * S + kc.T @ r["UD"](torch.exp(gl - gc)[:, None] * ur)
            continue
        gc, tinv, p = chunk_mats(kc, qc, g[sl], bc)
        eg, gl = torch.exp(gc)[:, None], gc[-1]
        sr = rt(S)
        if form == "tinv-bf16x2":  # the state as two bf16 halves (hi + lo: 16 bits, exact sum)
            hi = bf(S)
            sr = hi + bf(S - hi)
        if form.startswith("tinv"):
            pt = rt(p @ tinv)
            r = rt(bc[:, None] * (vc - eg * (kc @ sr)))
            u = tinv @ r
            o[sl] = scale * (eg * (qc @ sr) + pt @ r)
        else:
            w = rt(tinv @ rt(bc[:, None] * eg * kc))
            if form.startswith("wu-tb"):
                tb = rt(torch.tril(tinv * bc[None, :], -1))
                uu = tb @ vc + bc[:, None] * vc
            else:
                uu = tinv @ rt(bc[:, None] * vc)
            if form == "wu-bf16":
                w, uu = bf(w), bf(uu)
            if form == "wu-tb-wbf16":
                w = bf(w)
            u = uu - w @ sr
            ur = bf(u) if form == "wu-bf16" else rt(u)
            o[sl] = scale * (eg * (qc @ sr) + p @ ur)
        ud = torch.exp(gl - gc)[:, None] * u
        if form == "tinv-bf16x2":  # the update's A operand as two bf16 halves too
            hi = bf(ud)
            ud = hi + bf(ud - hi)
        else:
            ud = rt(ud)
        S = torch.exp(gl) * S + kc.T @ ud
    return o, S


def model(form, x, scale):
    """All heads of a make_inputs problem (B, T, H, HV, K, V), q and k already normalised."""
    q, k, v = x["q"].float(), x["k"].float(), x["v"].float()
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    o = torch.empty(B, T, HV, V)
    S = torch.empty(B, HV, K, V)
    for b in range(B):
        for hv in range(HV):
            h = hv // (HV // H)
            o[b, :, hv], S[b, hv] = run_form(
                form, q[b, :, h], k[b, :, h], v[b, :, hv], x["g"][b, :, hv].float(),
                x["beta"][b, :, hv].float(), x["initial_state"][b, hv].float(), scale)
    return o, S


def problem(B, T, H, HV, K, V, seed, beta32=False, gate_scale=1.0):
    x = make_inputs(B, T, H, HV, K, V, dtype=torch.bfloat16, state=True, seed=seed)
    if gate_scale != 1.0:  # slower decay: make_inputs' gates (mean -0.18 a step) scaled
        x["g"] = x["g"] * gate_scale
    if beta32:  # beta in float32, not exact in bf16 or tf32
        gen = torch.Generator().manual_seed(seed + 100)
        x["beta"] = torch.sigmoid(torch.randn(x["beta"].shape, generator=gen))
    # normalised keys and queries rounded to bf16, as gdn_matrix.py gives both sides
    for n in ("q", "k"):
        f = x[n].float()
        x[n] = (f / torch.sqrt((f * f).sum(-1, keepdim=True) + 1e-6)).bfloat16()
    return x


def rel(a, b):
    return float(workbench.compare(a.double(), b.double()).rel_l2)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--T", type=int, default=2048)
    ap.add_argument("--check-emulation", action=argparse.BooleanOptionalAction, default=True,
                    help="model 'tinv' against the CPU emulation of the kernels (builds it)")
    args = ap.parse_args()
    rows = []
    for K, beta32, gs in ((128, False, 1.0), (64, False, 1.0), (128, True, 1.0), (128, False, 0.1)):
        x = problem(1, args.T, 2, 4, K, K, seed=5, beta32=beta32, gate_scale=gs)
        scale = K ** -0.5
        ro, rs = oracle.chunked(**x, scale=scale)
        row = {"shape": f"B1 T{args.T} H2 HV4 K{K} V{K}",
               "beta": "float32" if beta32 else "bf16-representable",
               "gates": f"make_inputs' x {gs} (mean {float(x['g'].float().mean()):.3f} a step)", "vs_fp64": {}}
        for form in FORMS:
            o, s = model(form, x, scale)
            row["vs_fp64"][form] = {"o": rel(o, ro), "o_bf16": rel(bf(o), ro), "state": rel(s, rs)}
        rows.append(row)
        print(json.dumps(row))
    check = None
    if args.check_emulation:
        from workbench.kernels.gdn import mma_emu
        x = problem(1, 300, 1, 2, 128, 64, seed=7)
        scale = 128 ** -0.5
        eo, es = mma_emu.chunked(**x, scale=scale, output_dtype=torch.float32)
        mo, ms = model("tinv", x, scale)
        ro, rs = oracle.chunked(**x, scale=scale)
        check = {"shape": "B1 T300 H1 HV2 K128 V64",
                 "model_tinv_vs_emulation": {"o": rel(mo, eo), "state": rel(ms, es)},
                 "emulation_vs_fp64": {"o": rel(eo, ro), "state": rel(es, rs)},
                 "model_tinv_vs_fp64": {"o": rel(mo, ro), "state": rel(ms, rs)}}
        print(json.dumps(check))
    result = {
        "benchmark": "gdn_wu_form_accuracy",
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{cpu_name()}, Python {platform.python_version()}, torch {torch.__version__}",
        "rounding": "tf32 operands (cvt.rna), float32 sums (CPU BLAS order); rel L2 vs FP64 oracle",
        "rows": rows, "emulation_check": check,
    }
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
