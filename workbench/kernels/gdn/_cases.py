"""Random GDN problems shaped like the models' (for tests, benchmarks and notebooks).

q and k are drawn normal, v normal, g = logsigmoid(normal) (so exp(g) is a decay in (0, 1)),
beta = sigmoid(normal). Callers usually pass ``qk_l2norm=True``, as the models do; without it
the delta rule with unnormalized keys is unstable over long sequences.
"""

from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

__all__ = ["make_inputs", "case_id"]


def make_inputs(B=1, T=8, H=1, HV=2, K=8, V=8, *, dtype=torch.float32, state=False, seed=0,
                device="cpu") -> dict:
    """Keyword arguments of ``gdn.recurrent`` for one random problem (without backend/policy)."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32)

    out = dict(
        q=rnd(B, T, H, K).to(dtype), k=rnd(B, T, H, K).to(dtype), v=rnd(B, T, HV, V).to(dtype),
        g=F.logsigmoid(rnd(B, T, HV) + 2.0),
        # representable in the input dtype, so backends that read beta in it (fla) see the same
        beta=torch.sigmoid(rnd(B, T, HV)).to(dtype).float(),
        initial_state=(0.1 * rnd(B, HV, K, V)) if state else None,
    )
    return {k: (x.to(device) if x is not None else None) for k, x in out.items()}


def case_id(B, T, H, HV, K, V, dtype="fp32", state=False) -> str:
    return f"B{B}-T{T}-H{H}-HV{HV}-K{K}-V{V}-{dtype}" + ("-state" if state else "")


def selfcheck(backend: str, op: str, B, T, H, HV, K, V, state=True, chunk_size=None, seed=0):
    """Run one op of ``backend`` on a random problem; return rel L2 of o and state vs the oracle.

    JSON in, JSON out, so that it can run in a subprocess (the numba CUDA simulator test).
    """
    import workbench
    from workbench.kernels import gdn
    from workbench.kernels.gdn import oracle

    x = make_inputs(B, T, H, HV, K, V, state=state, seed=seed)
    ref_o, ref_s = oracle.recurrent(**x, qk_l2norm=True)
    kw = {"chunk_size": chunk_size} if op == "chunked" else {}
    o, s = getattr(gdn, op)(**x, qk_l2norm=True, backend=backend, **kw)
    return {"o": workbench.compare(ref_o, o).rel_l2, "state": workbench.compare(ref_s, s).rel_l2,
            "dtype": str(o.dtype)}


def packed_inputs(lengths, H=1, HV=2, K=8, V=8, *, dtype=torch.float32, state=True, seed=0,
                  device="cpu") -> dict:
    """A packed batch of sequences of ``lengths`` (B = 1; ``cu_seqlens`` a list; one initial state
    per sequence when ``state``): keyword arguments of ``gdn.recurrent``/``chunked``."""
    T = int(sum(lengths))
    x = make_inputs(1, T, H, HV, K, V, dtype=dtype, seed=seed, device=device)
    gen = torch.Generator().manual_seed(seed + 1)
    x["initial_state"] = ((0.1 * torch.randn(len(lengths), HV, K, V, generator=gen)).to(device) if state
                          else None)
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + int(n))
    x["cu_seqlens"] = cu
    return x


def varlen_selfcheck(backend: str, op: str, lengths, H=1, HV=2, K=8, V=8, chunk_size=None, seed=0,
                     device="cpu", dtype="float32"):
    """A packed batch through ``backend``: is it bitwise equal to each sequence run alone, and how
    far (rel L2 of o and the final states) from the FP64 oracle run per sequence? ``dtype``: of q,
    k, v (a name: "bfloat16" takes the CUDA ext backend's tensor-core path).

    JSON in, JSON out (the numba CUDA simulator runs it in a subprocess).
    """
    import workbench
    from workbench.kernels import gdn
    from workbench.kernels.gdn import oracle

    x = packed_inputs(lengths, H, HV, K, V, seed=seed, device=device, dtype=getattr(torch, dtype))
    kw = {"chunk_size": chunk_size} if op == "chunked" else {}
    o, s = getattr(gdn, op)(**x, qk_l2norm=True, backend=backend, **kw)
    cu, s0 = x["cu_seqlens"], x["initial_state"]
    alone_o, alone_s, ref_o, ref_s = [], [], [], []
    for i in range(len(lengths)):
        a, b = cu[i], cu[i + 1]
        part = {n: x[n][:, a:b] for n in ("q", "k", "v", "g", "beta")}
        init = s0[i:i + 1]
        if b > a:
            oi, si = getattr(gdn, op)(**part, initial_state=init, qk_l2norm=True, backend=backend, **kw)
            ro, rs = oracle.recurrent(**{n: t.cpu().double() for n, t in part.items()}, initial_state=init.cpu(),
                                      qk_l2norm=True)
            alone_o.append(oi); ref_o.append(ro)
        else:
            si, rs = init.to(s.dtype), init.cpu().double()
        alone_s.append(si); ref_s.append(rs)
    ao, as_ = torch.cat(alone_o, 1), torch.cat(alone_s, 0)
    return {"bitwise": bool(torch.equal(o, ao) and torch.equal(s, as_)),
            "o": workbench.compare(torch.cat(ref_o, 1), o.cpu()).rel_l2,
            "state": workbench.compare(torch.cat(ref_s, 0), s.cpu()).rel_l2,
            "shape_o": list(o.shape), "shape_state": list(s.shape)}


# values that probe the one rounding of o to bf16 / fp16: ties, subnormals, overflow; inf and NaN
# (which the recurrence turns into NaN)
ROUNDING_PROBES = [0.0, 1.0, 1.00390625, 1.01171875, 1.0009765625, 1.0029296875, -1.00390625, 3.0e38,
                   3.3961e38, 3.3965e38, 65504.0, 65519.0, 65520.0, -65520.0, 1.0e-40, 1.2e-38, 5.9604645e-08, 2.9802322e-08,
                   8.940697e-08, 6.0e-05, 6.1035156e-05, 1.0e-9, float("inf"), float("-inf"), float("nan"), 0.1, -7.3]


def direct_selfcheck(backend: str, device: str = "cpu", seed: int = 0, full: bool = True) -> dict:
    """The copy-free recurrence of ``backend`` (ext, numba) through the public call, checked:

    - ``bitwise``: for q, k, v in bf16 / fp16 / fp32, g and beta in float32 / bf16 / fp16, with and
      without an initial state and the in-kernel L2 norm, o and the final state equal bit for bit
      the kernel run on float32 copies of the same values with o rounded afterwards by torch
      (``.to(dtype)``), and the initial state is left as it was;
    - ``rounding``: o written in bf16 / fp16 by the kernel equals torch's rounding of the kernel's
      float32 o (NaN as NaN) on a problem whose o is v (K = 16, q = k = e0, beta = 1, g = 0,
      scale 1, zero state), with v the values of :data:`ROUNDING_PROBES` (``probes_pass``: the
      finite ones come out of the float32 run unchanged, so they reach the rounding);
    - ``o``/``state``: the largest rel L2 from the FP64 oracle over the cases.

    ``full=False`` runs a subset (bf16 / fp16 inputs, g and beta in float32 / bf16, with an initial
    state), on a smaller problem: what the numba CUDA simulator, which runs it in a subprocess, can
    afford. JSON in, JSON out.
    """
    import workbench
    from workbench.kernels import gdn
    from workbench.kernels.gdn import oracle
    from workbench.kernels.gdn._checks import check_gdn

    B, T, H, HV, K, V = (2, 3, 2, 4, 16, 8) if full else (1, 2, 1, 2, 8, 4)
    dts = (torch.bfloat16, torch.float16, torch.float32) if full else (torch.bfloat16, torch.float16)
    gdts = (torch.float32, torch.bfloat16, torch.float16) if full else (torch.float32, torch.bfloat16)
    states = (False, True) if full else (True,)

    mod = importlib.import_module(f"workbench.kernels.gdn.{'ext' if backend == 'ext' else 'numba_cuda'}")
    bad, worst_o, worst_s, n = [], 0.0, 0.0, 0
    for dt in dts:
        for gdt in gdts:
            for state in states:
                for l2 in (False, True):
                    x = make_inputs(B, T, H, HV, K, V, dtype=dt, state=state, seed=seed + n, device=device)
                    x["g"], x["beta"] = x["g"].to(gdt), x["beta"].to(gdt if gdt != torch.float16 else torch.bfloat16)
                    h0 = x["initial_state"].clone() if state else None
                    o, s = gdn.recurrent(**x, qk_l2norm=l2, backend=backend)
                    # the same kernel on float32 copies, o rounded by torch
                    wide = [x[nm].float().contiguous() for nm in ("q", "k", "v", "g", "beta")]
                    sh = check_gdn(*wide, None, x["initial_state"])
                    st = (x["initial_state"].clone() if state else torch.zeros(B, HV, K, V, device=device))
                    o32 = torch.empty(B, T, HV, V, device=device)
                    if backend == "ext":
                        mod.launch("recurrent", sh, 0, 0, tuple(wide), st, o32, qk_l2norm=l2)
                    else:
                        mod.recurrence(sh, tuple(wide), st, o32, qk_l2norm=l2)
                    same = torch.equal(o, o32.to(dt)) and torch.equal(s, st)
                    same = same and (not state or torch.equal(x["initial_state"], h0))
                    if not same:
                        bad.append(f"{dt} g/beta {gdt} state={state} l2={l2}")
                    ro, rs = oracle.recurrent(**{nm: (t.cpu() if t is not None else None) for nm, t in x.items()},
                                              qk_l2norm=l2)
                    worst_o = max(worst_o, workbench.compare(ro, o.cpu()).rel_l2)
                    worst_s = max(worst_s, workbench.compare(rs, s.cpu()).rel_l2)
                    n += 1
    probes = torch.tensor(ROUNDING_PROBES, dtype=torch.float32)
    P = probes.numel()
    q = torch.zeros(1, 1, 1, 16)
    q[..., 0] = 1.0
    args = (q.to(device), q.to(device), probes.reshape(1, 1, 1, P).to(device), torch.zeros(1, 1, 1, device=device),
            torch.ones(1, 1, 1, device=device))
    o32, _ = gdn.recurrent(*args, scale=1.0, backend=backend)
    o32 = o32.cpu().reshape(-1)
    fin = torch.isfinite(probes)
    rounding = {"probes_pass": bool(torch.equal(o32[fin], probes[fin]))}
    for name, odt in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        o, _ = gdn.recurrent(*args, scale=1.0, backend=backend, policy={"output_dtype": name})
        want, got = o32.to(odt), o.cpu().reshape(-1)
        nan = torch.isnan(want)
        rounding[name] = bool(o.dtype == odt and torch.equal(torch.isnan(got), nan) and torch.equal(got[~nan], want[~nan]))
    return {"bitwise": not bad, "mismatches": bad, "cases": n, "rounding": rounding, "o": worst_o, "state": worst_s}
