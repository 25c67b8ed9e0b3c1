"""Random GDN problems shaped like the models' (for tests, benchmarks and notebooks).

q and k are drawn normal, v normal, g = logsigmoid(normal) (so exp(g) is a decay in (0, 1)),
beta = sigmoid(normal). Callers usually pass ``qk_l2norm=True``, as the models do; without it
the delta rule with unnormalized keys is unstable over long sequences.
"""

from __future__ import annotations

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
                     device="cpu"):
    """A packed batch through ``backend``: is it bitwise equal to each sequence run alone, and how
    far (rel L2 of o and the final states) from the FP64 oracle run per sequence?

    JSON in, JSON out (the numba CUDA simulator runs it in a subprocess).
    """
    import workbench
    from workbench.kernels import gdn
    from workbench.kernels.gdn import oracle

    x = packed_inputs(lengths, H, HV, K, V, seed=seed, device=device)
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
            ro, rs = oracle.recurrent(**{n: t.cpu() for n, t in part.items()}, initial_state=init.cpu(), qk_l2norm=True)
            alone_o.append(oi); ref_o.append(ro)
        else:
            si, rs = init.to(s.dtype), init.cpu().double()
        alone_s.append(si); ref_s.append(rs)
    ao, as_ = torch.cat(alone_o, 1), torch.cat(alone_s, 0)
    return {"bitwise": bool(torch.equal(o, ao) and torch.equal(s, as_)),
            "o": workbench.compare(torch.cat(ref_o, 1), o.cpu()).rel_l2,
            "state": workbench.compare(torch.cat(ref_s, 0), s.cpu()).rel_l2,
            "shape_o": list(o.shape), "shape_state": list(s.shape)}
