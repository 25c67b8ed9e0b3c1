"""A hybrid-attention run as another engine would write it, for the notebooks' discovery tests.

Two Gated DeltaNet layers under the op ``linear_attn`` (flash-linear-attention's names ``q, k, v,
g, beta``, the state ``state`` ``[HV, K, V]`` after every step, the output ``core``) and one sparse
attention layer under ``sparse_attn`` (``q, k, v, indices, o``), prefill of ``PREFILL`` tokens
recorded whole at step 0, then ``DECODE`` one-token steps; no run metadata at all (no policy,
no model config, no expectation). Computed with the workbench's torch kernels:

- ``control``: fp32 GDN state;
- ``control-repeat``: the prefill computed chunked instead of step by step (fp32 reassociation:
  the A/A noise);
- ``candidate``: layer ``BF16_LAYER``'s GDN keeps its state in bf16, every other tensor as the
  control's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from workbench.capture import CaptureWriter
from workbench.kernels import gdn, qsa
from workbench.numerics.policy import Policy

PREFILL, DECODE = 48, 16
H, HV, K, V = 1, 2, 16, 16
HQ, HKV, D = 4, 1, 16
GDN_LAYERS, ATTN_LAYER = (0, 1), 2
BF16_LAYER = 1
TOPK = 24


def _inputs(seed: int):
    gen = torch.Generator().manual_seed(seed)
    T = PREFILL + DECODE
    r = lambda *s: torch.randn(*s, generator=gen)
    gdn_in = {l: dict(q=r(1, T, H, K), k=r(1, T, H, K), v=r(1, T, HV, V),
                      g=-0.1 * torch.rand(1, T, HV, generator=gen), beta=torch.rand(1, T, HV, generator=gen))
              for l in GDN_LAYERS}
    attn = dict(q=r(T, HQ, D), k=r(T, HKV, D), v=r(T, HKV, D))
    idx = []
    for t in range(T):  # the selected positions of each query: up to TOPK of those before it, -1 padded
        sel = torch.randperm(t + 1, generator=gen)[:TOPK].sort().values.int()
        idx.append(torch.cat([sel, torch.full((TOPK - len(sel),), -1, dtype=torch.int32)]))
    attn["indices"] = torch.stack(idx)
    return gdn_in, attn


def _write(path: Path, arm: str, *, bf16_layer: int | None, chunked_prefill: bool) -> Path:
    gdn_in, attn = _inputs(0)
    cut = lambda x, a, b: x[:, a:b]
    with CaptureWriter(path, arm=arm, run={}) as w:
        states = {}
        for step in range(DECODE + 1):
            a, b = (0, PREFILL) if step == 0 else (PREFILL + step - 1, PREFILL + step)
            for l in GDN_LAYERS:
                x = {n: cut(t, a, b) for n, t in gdn_in[l].items()}
                pol = Policy(state_dtype="bf16") if l == bf16_layer else Policy()
                if step == 0 and chunked_prefill:
                    o, s = gdn.chunked(*x.values(), qk_l2norm=True, policy=pol, chunk_size=16)
                else:
                    o, s = gdn.recurrent(*x.values(), initial_state=states.get(l), qk_l2norm=True, policy=pol)
                states[l] = s
                for n, t in x.items():
                    w.add(t[0], step=step, layer=l, op="linear_attn", name=n)
                w.add(o[0], step=step, layer=l, op="linear_attn", name="core")
                w.add(s[0], step=step, layer=l, op="linear_attn", name="state")
            for n in ("q", "k", "v", "indices"):
                w.add(attn[n][a:b], step=step, layer=ATTN_LAYER, op="sparse_attn", name=n)
            T = b
            cache = qsa.PagedKVCache.from_dense(attn["k"][None, :T], attn["v"][None, :T], page_size=4)
            o, _ = qsa.sparse_decode(attn["q"][b - 1:b], cache, cache.block_table, attn["indices"][b - 1:b], num_splits=2)
            w.add(o, step=step, layer=ATTN_LAYER, op="sparse_attn", name="o")
    return path


def write_user_hybrid(d: Path) -> dict[str, Path]:
    """The three captures of the module docstring under ``d``."""
    return {"control": _write(d / "control", "control", bf16_layer=None, chunked_prefill=False),
            "control-repeat": _write(d / "control-repeat", "control-repeat", bf16_layer=None, chunked_prefill=True),
            "candidate": _write(d / "candidate", "candidate", bf16_layer=BF16_LAYER, chunked_prefill=False)}
