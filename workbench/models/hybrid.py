"""A tiny hybrid decoder (Qwen3-Next layer pattern) built from ``workbench.kernels``.

Layers follow the pattern GDN, GDN, GDN, QSA (repeated; 8 layers by default), each a pre-norm
residual block: ``x = x + mixer(rmsnorm(x)); x = x + mlp(rmsnorm(x))``. The final RMSNorm'd hidden
goes through an lm_head (split-K GEMM), the logits are materialized in ``policy.logits_dtype``
(BF16 by default) and a sampler picks the token (greedy, first maximum; or a stateless draw).

Every kernel call goes through the public functions of ``workbench.kernels`` with the backend and
the numerics policy of the arm (:class:`ArmConfig`), so an arm is a configuration, not a code
fork. Tensor parallelism is simulated: each of ``tp`` ranks owns a slice of the heads (GDN value
heads with the q/k heads they read, QSA query heads; the single QSA KV head and the indexer are
replicated), of the MLP hidden units and of the columns of the output projections; the ranks'
partial outputs are summed by an emulated all-reduce in a fixed order (rank 0 + rank 1 + ...,
fp32), and every rank then holds the same residual stream.

One call of :meth:`HybridDecoder.generate` is a prefill (step 0) followed by decode steps
(1, 2, ...), each feeding back the token sampled at the step before. With a
:class:`~workbench.capture.CaptureWriter` the model records itself (see :class:`RecordSpec` and
docs/models.md for the keys).

Example
-------
>>> from workbench.models.hybrid import HybridConfig, HybridDecoder, ArmConfig
>>> model = HybridDecoder(HybridConfig(n_layers=4, vocab=64))
>>> tokens = model.generate(model.prompt(32), steps=2, arm=ArmConfig(tp=2))
>>> len(tokens)
3
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from workbench.errors import GraftError, WorkbenchError
from workbench.kernels import gdn, gemm, qsa, sampling
from workbench.numerics.policy import Policy

__all__ = ["HybridConfig", "ArmConfig", "Override", "RecordSpec", "HybridDecoder", "HybridRerun", "FAMILIES"]

FAMILIES = ("gdn", "qsa", "proj", "lm_head")
# the projections of the "proj" family by name (Override.names)
PROJECTIONS = ("gdn.q", "gdn.k", "gdn.v", "gdn.z", "gdn.a", "gdn.b", "gdn.o", "qsa.q", "qsa.gate", "qsa.k", "qsa.v",
               "qsa.iq", "qsa.ik", "qsa.o", "mlp.gate", "mlp.up", "mlp.down")
# the GDN helper ops (gates, conv, gated norm) and the QSA indexer and output gate exist in the torch
# and oracle backends only: with a native or numba backend the model runs torch's (recorded in
# workbench.kernels.fallbacks(), warned once), and the kernel ops themselves on the backend asked for
_HELPER_FALLBACK = "torch"
_BACKEND_FAMILY = {"gdn": "gdn", "qsa": "qsa", "proj": "gemm", "lm_head": "gemm"}


@dataclass(frozen=True)
class HybridConfig:
    """Shapes of the model and the seed of its weights.

    Attributes
    ----------
    vocab, d_model, n_layers, d_ff: vocabulary, residual width, layers, MLP hidden units
    pattern: mixer of each layer, cycled (three GDN then one QSA, as in Qwen3-Next)
    gdn_heads, gdn_v_heads, gdn_head_dim: GDN q/k heads H, value heads HV, K = V
    conv_kernel: width of the GDN depthwise causal conv
    qsa_q_heads, qsa_kv_heads, qsa_head_dim: QSA query heads, KV heads (GQA), head dim
    index_heads, index_dim: QSA indexer heads and dim
    ratio: tokens per indexer block (= KV page size); budget: tokens selected from complete blocks
    seed: weights are drawn from this seed (and rounded to bf16-representable values, as a bf16
        checkpoint would be)
    """

    vocab: int = 1024
    d_model: int = 128
    n_layers: int = 8
    d_ff: int = 256
    pattern: tuple[str, ...] = ("gdn", "gdn", "gdn", "qsa")
    gdn_heads: int = 2
    gdn_v_heads: int = 4
    gdn_head_dim: int = 16
    conv_kernel: int = 4
    qsa_q_heads: int = 4
    qsa_kv_heads: int = 1
    qsa_head_dim: int = 32
    index_heads: int = 2
    index_dim: int = 32
    ratio: int = 4
    budget: int = 64
    eps: float = 1e-6
    seed: int = 0

    def layer_kind(self, layer: int) -> str:
        return self.pattern[layer % len(self.pattern)]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["pattern"] = list(self.pattern)
        return d


@dataclass(frozen=True)
class Override:
    """Policy knobs changed for one family on some layers and/or ranks (None: all of them).

    >>> Override("qsa", {"prob_dtype": "fp16"}, ranks=(2,))      # doctest: +SKIP
    """

    family: str
    knobs: dict
    layers: tuple[int, ...] | None = None
    ranks: tuple[int, ...] | None = None
    names: tuple[str, ...] | None = None  # "proj" only: the projections, e.g. ("gdn.a", "gdn.b") (PROJECTIONS)
    phase: str | None = None  # "prefill" (steps over several tokens) or "decode" (one-token steps); None: both

    def applies(self, family: str, layer: int | None, rank: int | None, name: str | None = None,
                phase: str | None = None) -> bool:
        return (self.family == family
                and (self.layers is None or layer in self.layers)
                and (self.ranks is None or rank in self.ranks)
                and (self.names is None or name in self.names)
                and (self.phase is None or phase == self.phase))

    def to_dict(self) -> dict[str, Any]:
        d = {"family": self.family, "knobs": dict(self.knobs),
             "layers": None if self.layers is None else list(self.layers),
             "ranks": None if self.ranks is None else list(self.ranks)}
        if self.names is not None:
            d["names"] = list(self.names)
        if self.phase is not None:
            d["phase"] = self.phase
        return d


def arm_from_changes(text: str, *, name: str = "candidate", base: "ArmConfig | None" = None) -> "ArmConfig":
    """An arm from ``family.knob:value`` changes typed as text, applied to ``base`` (default: the
    default arm), e.g. ``"gdn.state_dtype:bf16 qsa.prob_dtype:fp16"``; empty text: ``base`` renamed.

    >>> arm_from_changes("gdn.state_dtype:bf16").gdn.state_dtype
    'bf16'
    """
    base = base or ArmConfig()
    changes: dict = {}
    for part in str(text or "").replace(",", " ").split():
        fam, dot, knob = part.partition(".")
        if not dot or fam not in FAMILIES:
            raise WorkbenchError(f"arm change {part!r} is not family.knob:value", key="candidate",
                                 fix=f"write e.g. 'gdn.state_dtype:bf16'; families are {list(FAMILIES)}")
        changes[fam] = Policy.parse(knob, base=changes.get(fam, base.policy(fam)))
    return base.replace(name=name, **changes)


def _default_backends() -> dict[str, str]:
    return {"gdn": "torch", "qsa": "torch", "proj": "torch", "lm_head": "torch"}


@dataclass(frozen=True)
class ArmConfig:
    """One arm of an experiment: backends and numerics policies, not code.

    Attributes
    ----------
    name: arm name written into the capture
    backends: backend per family: ``gdn`` (workbench.kernels.gdn), ``qsa``, ``proj`` (split-K
        GEMM of every projection) and ``lm_head`` (split-K GEMM); missing families use "torch"
    gdn, qsa, proj, lm_head: the Policy of each family. ``qsa.num_kv_splits`` is the number of
        KV splits of the sparse attention; ``proj.splitk``/``partial_dtype`` the split-K of every
        projection; ``lm_head.splitk``/``partial_dtype``/``reduction_order`` those of the lm_head
        and ``lm_head.logits_dtype`` the dtype the logits are materialized in before sampling
    tp: simulated tensor-parallel ranks (the head counts must divide evenly)
    sampler: "greedy" (first maximum) or "draw" (stateless inverse-CDF draw, u from
        ``draw_seed`` and the step)
    page_seed: None keeps KV pages in allocation order; an int permutes the physical pages
        (the block table changes, the logical content does not)
    overrides: :class:`Override` entries (policy knobs per layer and/or rank)
    prefill_chunk: None prefills the prompt in one call (step 0); an int prefills it in chunks of
        that many tokens, one step each (64 + 64 for a 128-token prompt: steps 0 and 1), carrying
        the GDN and conv states and the KV cache over, as an engine's chunked prefill does
    """

    name: str = "control"
    backends: dict = field(default_factory=_default_backends)
    gdn: Policy = Policy()
    qsa: Policy = Policy(num_kv_splits=2)
    proj: Policy = Policy()
    lm_head: Policy = Policy()
    tp: int = 2
    sampler: str = "greedy"
    draw_seed: int = 0
    page_seed: int | None = None
    overrides: tuple[Override, ...] = ()
    prefill_chunk: int | None = None

    def __post_init__(self) -> None:
        if self.prefill_chunk is not None and (not isinstance(self.prefill_chunk, int) or self.prefill_chunk < 1):
            raise WorkbenchError(f"ArmConfig.prefill_chunk must be a positive int or None, got {self.prefill_chunk!r}",
                                 key="prefill_chunk", fix="pass prefill_chunk=64, or None for one prefill call")
        if self.sampler not in ("greedy", "draw"):
            raise WorkbenchError(f"ArmConfig.sampler must be one of ['greedy', 'draw'], got {self.sampler!r}",
                                 key="sampler", fix="pass sampler='greedy' or sampler='draw'")
        unknown = sorted(set(self.backends) - set(FAMILIES))
        if unknown:
            raise WorkbenchError(f"ArmConfig.backends has unknown families {unknown}", key="backends",
                                 fix=f"use families {list(FAMILIES)}")
        for o in self.overrides:
            if o.family not in FAMILIES:
                raise WorkbenchError(f"Override.family must be one of {list(FAMILIES)}, got {o.family!r}",
                                     key="overrides", fix=f"use one of {list(FAMILIES)}")
            getattr(self, o.family).replace(**o.knobs)  # unknown knobs fail here, not mid-run
            bad = [n for n in (o.names or ()) if n not in PROJECTIONS]
            if bad or (o.names is not None and o.family != "proj"):
                raise WorkbenchError(f"Override.names must name projections of the proj family, got {o.family!r} "
                                     f"{list(o.names)}", key="overrides", fix=f"use family 'proj' and names from {list(PROJECTIONS)}")
            if o.phase not in (None, "prefill", "decode"):
                raise WorkbenchError(f"Override.phase must be 'prefill', 'decode' or None, got {o.phase!r}",
                                     key="overrides", fix="pass phase='decode' for one-token steps")
        if not isinstance(self.tp, int) or self.tp < 1:
            raise WorkbenchError(f"ArmConfig.tp must be a positive int, got {self.tp!r}", key="tp",
                                 fix="pass tp=1, 2 or 4")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ArmConfig":
        """The arm :meth:`to_dict` wrote (a capture's ``run["arm"]``)."""
        pol = {f: Policy.from_dict(d[f]) for f in ("gdn", "qsa", "proj", "lm_head") if isinstance(d.get(f), dict)}
        ov = tuple(Override(o["family"], dict(o["knobs"]), None if o.get("layers") is None else tuple(o["layers"]),
                            None if o.get("ranks") is None else tuple(o["ranks"]),
                            None if o.get("names") is None else tuple(o["names"]), o.get("phase"))
                   for o in d.get("overrides") or ())
        return cls(name=str(d.get("name", "arm")), backends=dict(d.get("backends") or _default_backends()), **pol,
                   tp=int(d.get("tp", 2)), sampler=str(d.get("sampler", "greedy")), draw_seed=int(d.get("draw_seed", 0)),
                   page_seed=d.get("page_seed"), overrides=ov, prefill_chunk=d.get("prefill_chunk"))

    def policy(self, family: str, layer: int | None = None, rank: int | None = None, *, name: str | None = None,
               phase: str | None = None) -> Policy:
        """The policy of ``family`` on ``layer`` and ``rank`` (for ``proj``: of projection ``name``
        in ``phase``), overrides applied in order."""
        p = getattr(self, family)
        for o in self.overrides:
            if o.applies(family, layer, rank, name, phase):
                p = p.replace(**o.knobs)
        return p

    def backend(self, family: str) -> str:
        return self.backends.get(family, "torch")

    def replace(self, **changes: Any) -> "ArmConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "backends": {f: self.backend(f) for f in FAMILIES},
                **{f: getattr(self, f).to_dict() for f in FAMILIES},
                "tp": self.tp, "sampler": self.sampler, "draw_seed": self.draw_seed,
                "page_seed": self.page_seed, "overrides": [o.to_dict() for o in self.overrides],
                **({"prefill_chunk": self.prefill_chunk} if self.prefill_chunk is not None else {})}


@dataclass(frozen=True)
class RecordSpec:
    """What the model writes into a capture (keeps the bundled captures small).

    Attributes
    ----------
    detail_steps: steps at which every internal tensor is recorded (None: every step)
    every_step: ``"op/name"`` of the tensors recorded at every step as well (the GDN state for
        drift over decode, each layer's output, the lm_head input and logits, the token)
    prefill_positions: per-token tensors of the prefill keep only the prompt's last this many
        positions (tag ``positions="a:b"``: rows a to b of the step; a prefill chunk holding none of
        them records no per-token tensor); None keeps all
    lm_head_weight: record the lm_head weight (fp32, step 0) for split-K replay
    batch_rows: record which request and position each step's token rows are, so that arms that
        chunk the prefill differently align by position (:mod:`workbench.capture.align`)
    conv_state: record the GDN conv windows after every step
    mlp_detail: layers whose MLP is recorded in full at the detail steps: the input (rank 0), each
        rank's gate and up projections, activation and down-projection partial, and the weights
        (bf16, as held: the checkpoint's values) with the prefill's last step; what
        :func:`workbench.analysis.sharding.sharding_replay` reads
    qsa_cache_steps: steps at which each QSA layer's sparse decode is recorded in full for replay
        (:func:`workbench.analysis.replay` with ``op="qsa"``): the paged ``k_cache``, ``v_cache``
        ``[pages, page, kvh, d]`` it reads, its ``block_table`` ``[t, pages]``, and the ``q`` and
        ``indices`` it is called with (also at steps that are not detail steps)
    """

    detail_steps: tuple[int, ...] | None = (0, 1, 2, 3, 8, 16, 32, 48, 64)
    every_step: tuple[str, ...] = ("gdn/state", "layer/output", "lm_head/input", "lm_head/logits", "sampler/token")
    prefill_positions: int | None = 8
    lm_head_weight: bool = False
    batch_rows: bool = False  # record each step's (request, position) rows (CaptureWriter.add_batch)
    conv_state: bool = False  # record the GDN conv windows (gdn/conv_state_q, _k, _v) after every step
    mlp_detail: tuple[int, ...] = ()  # layers whose MLP internals (and weights, at step 0) are recorded
    qsa_cache_steps: tuple[int, ...] = ()  # steps whose QSA decode inputs (paged K/V cache, block table) are recorded

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["detail_steps"] = None if self.detail_steps is None else list(self.detail_steps)
        d["every_step"] = list(self.every_step)
        for opt in ("mlp_detail", "qsa_cache_steps"):
            d[opt] = list(getattr(self, opt))
            if not d[opt]:
                del d[opt]  # the manifests of captures that record none stay as they were
        return d


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def init_weights(cfg: HybridConfig) -> dict[str, torch.Tensor]:
    """Seeded random weights (fp32 holding bf16-representable values)."""
    g = torch.Generator().manual_seed(cfg.seed)
    D = cfg.d_model

    def w(*shape, std):
        return _bf16(torch.randn(*shape, generator=g) * std)

    W = {"embed": w(cfg.vocab, D, std=1.0), "final_norm": torch.ones(D),
         "lm_head": w(cfg.vocab, D, std=D ** -0.5)}
    H, HV, K = cfg.gdn_heads, cfg.gdn_v_heads, cfg.gdn_head_dim
    HQ, HKV, Dh, HI, Di = cfg.qsa_q_heads, cfg.qsa_kv_heads, cfg.qsa_head_dim, cfg.index_heads, cfg.index_dim
    for i in range(cfg.n_layers):
        p = f"layers.{i}."
        W[p + "attn_norm"] = torch.ones(D)
        W[p + "mlp_norm"] = torch.ones(D)
        if cfg.layer_kind(i) == "gdn":
            W[p + "q"] = w(H * K, D, std=D ** -0.5)
            W[p + "k"] = w(H * K, D, std=D ** -0.5)
            W[p + "v"] = w(HV * K, D, std=D ** -0.5)
            W[p + "z"] = w(HV * K, D, std=D ** -0.5)
            W[p + "a"] = w(HV, D, std=D ** -0.5)
            W[p + "b"] = w(HV, D, std=D ** -0.5)
            W[p + "conv"] = w((2 * H + HV) * K, cfg.conv_kernel, std=0.5)
            # slow decay (exp(g) ~ 0.95..0.99): the state remembers tens of tokens
            W[p + "A_log"] = _bf16(torch.log(torch.rand(HV, generator=g) * 0.08 + 0.02))
            W[p + "dt_bias"] = torch.zeros(HV)
            W[p + "gnorm"] = torch.ones(K)
            W[p + "o"] = w(D, HV * K, std=0.5 * (HV * K) ** -0.5)
        else:
            W[p + "q"] = w(HQ * Dh, D, std=D ** -0.5)
            W[p + "k"] = w(HKV * Dh, D, std=D ** -0.5)
            W[p + "v"] = w(HKV * Dh, D, std=D ** -0.5)
            W[p + "gate"] = w(HQ * Dh, D, std=D ** -0.5)
            W[p + "iq"] = w(HI * Di, D, std=D ** -0.5)
            W[p + "ik"] = w(Di, D, std=D ** -0.5)
            W[p + "o"] = w(D, HQ * Dh, std=0.5 * (HQ * Dh) ** -0.5)
        W[p + "mlp_gate"] = w(cfg.d_ff, D, std=D ** -0.5)
        W[p + "mlp_up"] = w(cfg.d_ff, D, std=D ** -0.5)
        W[p + "mlp_down"] = w(D, cfg.d_ff, std=0.5 * cfg.d_ff ** -0.5)
    return W


def _part(n: int, tp: int, rank: int, what: str) -> range:
    if n % tp:
        raise WorkbenchError(f"{what}={n} cannot be split over tp={tp} ranks", key="tp",
                             fix=f"use a tp that divides {what}")
    per = n // tp
    return range(rank * per, (rank + 1) * per)


def _rows(heads, dim: int) -> torch.Tensor:
    return torch.cat([torch.arange(h * dim, (h + 1) * dim) for h in heads])


class _Tape:
    """Writes the model's tensors with the current step; drops what the RecordSpec leaves out."""

    def __init__(self, writer, spec: RecordSpec) -> None:
        self.writer = writer
        self.spec = spec
        self.step = 0
        self.draw = 0       # the sampling draw of this step: the step counted from the last prefill chunk
        self.rows = None    # (first position, prompt length) in a prefill step; None when decoding

    @property
    def detail(self) -> bool:
        d = self.spec.detail_steps
        return self.writer is not None and (d is None or self.step in d)

    @property
    def qsa_cache(self) -> bool:
        return self.writer is not None and self.step in self.spec.qsa_cache_steps

    def add(self, t: torch.Tensor, *, rank: int, layer: int, op: str, name: str, tokens: bool = False,
            force: bool = False) -> None:
        """``tokens``: t's first dim is the token dim (sliced at prefill). Per-rank tensors carry
        their layout over the simulated TP ranks (:data:`LAYOUTS`). ``force``: record at this step
        whatever the detail steps say."""
        if self.writer is None or not (force or self.detail or f"{op}/{name}" in self.spec.every_step):
            return
        tags = {}
        n = self.spec.prefill_positions
        if tokens and self.rows is not None and n is not None:
            # keep the prompt's last n positions: rows lo..T of this step (a chunk holds some or none)
            a, total = self.rows
            T = t.shape[0]
            lo = max(0, total - n - a)
            if lo >= T:
                return
            if lo > 0:
                t = t[lo:]
                tags["positions"] = f"{lo}:{T}"
        self.writer.add(t, rank=rank, step=self.step, layer=layer, op=op, name=name,
                        dims=LAYOUTS.get(f"{op}/{name}"), **tags)


# how each per-rank tensor splits over the simulated TP ranks (workbench.capture.dims): heads are
# split in rank order; GDN q/k and QSA KV heads repeat over consecutive ranks when there are fewer
# heads than ranks (grouped); the indexer is computed whole on every rank
LAYOUTS = {
    "gdn/q": "t h[tp:grouped] d", "gdn/k": "t h[tp:grouped] d", "gdn/v": "t hv[tp] d", "gdn/g": "t hv[tp]",
    "gdn/beta": "t hv[tp]", "gdn/core": "t hv[tp] d", "gdn/state": "hv[tp] k v",
    "gdn/conv_state_q": "(h*d)[tp:grouped] w", "gdn/conv_state_k": "(h*d)[tp:grouped] w",
    "gdn/conv_state_v": "(hv*d)[tp] w",
    "qsa/q": "t h[tp] d", "qsa/gate": "t h[tp] d", "qsa/k": "t kvh[tp:grouped] d", "qsa/v": "t kvh[tp:grouped] d",
    "qsa/index_scores": "t n # tp:replicated", "qsa/indices": "t n # tp:replicated",
    "qsa/partial_o": "t h[tp] s d", "qsa/partial_lse": "t h[tp] s", "qsa/o": "t h[tp] d", "qsa/lse": "t h[tp]",
    "qsa/gated": "t h[tp] d",
    "qsa/k_cache": "pg s kvh[tp:grouped] d", "qsa/v_cache": "pg s kvh[tp:grouped] d",
    "qsa/block_table": "t n # tp:replicated",
    "mlp/gate": "t f[tp]", "mlp/up": "t f[tp]", "mlp/act": "t f[tp]", "mlp/partial": "t d[tp:partial]",
    "mlp/w_gate": "f[tp] d", "mlp/w_up": "f[tp] d", "mlp/w_down": "d f[tp]",
}


class HybridDecoder:
    """The tiny hybrid decoder. Weights are plain tensors (``self.weights``), so a planted
    variant is a copy with some rows changed (see :meth:`with_weights`)."""

    def __init__(self, config: HybridConfig | None = None, *, weights: dict | None = None) -> None:
        self.config = config or HybridConfig()
        self.weights = weights if weights is not None else init_weights(self.config)

    def with_weights(self, **changes: torch.Tensor) -> "HybridDecoder":
        w = dict(self.weights)
        w.update(changes)
        return HybridDecoder(self.config, weights=w)

    def prompt(self, length: int = 256, *, seed: int = 1) -> torch.Tensor:
        """A seeded random prompt ``[length]`` int64."""
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.config.vocab, (length,), generator=g)

    # -- helpers --------------------------------------------------------------------------------
    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.config.eps) * w

    def _mm(self, x, w, arm: ArmConfig, layer: int, rank: int, family: str = "proj", name: str | None = None):
        pol = arm.policy(family, layer, rank, name=name, phase="decode" if x.shape[0] == 1 else "prefill")
        return gemm.splitk_matmul(x, w, policy=pol, backend=arm.backend(family), out_dtype="fp32")

    @staticmethod
    def _all_reduce(parts: list[torch.Tensor]) -> torch.Tensor:
        """Sum in rank order 0, 1, 2, ... in fp32 (a fixed-order ring emulation)."""
        acc = parts[0]
        for p in parts[1:]:
            acc = acc + p
        return acc

    # -- layers ---------------------------------------------------------------------------------
    def _gdn(self, i: int, xn: torch.Tensor, arm: ArmConfig, cache: dict, tape: _Tape) -> torch.Tensor:
        c, W, p = self.config, self.weights, f"layers.{i}."
        H, HV, K = c.gdn_heads, c.gdn_v_heads, c.gdn_head_dim
        G = HV // H
        T = xn.shape[0]
        parts = []
        for r in range(arm.tp):
            vh = list(_part(HV, arm.tp, r, "gdn_v_heads"))
            kh = sorted({h // G for h in vh})
            pol = arm.policy("gdn", i, r)
            be = arm.backend("gdn")
            kr, vr = _rows(kh, K), _rows(vh, K)
            q = self._mm(xn, W[p + "q"][kr], arm, i, r, name="gdn.q")
            k = self._mm(xn, W[p + "k"][kr], arm, i, r, name="gdn.k")
            v = self._mm(xn, W[p + "v"][vr], arm, i, r, name="gdn.v")
            z = self._mm(xn, W[p + "z"][vr], arm, i, r, name="gdn.z")
            a = self._mm(xn, W[p + "a"][vh], arm, i, r, name="gdn.a")
            b = self._mm(xn, W[p + "b"][vh], arm, i, r, name="gdn.b")
            conv = W[p + "conv"]
            conv_rows = torch.cat([kr, H * K + kr, 2 * H * K + vr])
            qkv, cache[("conv", i, r)] = gdn.causal_conv1d(
                torch.cat([q, k, v], -1)[None], conv[conv_rows], state=cache.get(("conv", i, r)),
                backend=be, policy=pol, fallback=_HELPER_FALLBACK)
            nk = len(kh) * K
            q = qkv[0, :, :nk].reshape(1, T, len(kh), K)
            k = qkv[0, :, nk:2 * nk].reshape(1, T, len(kh), K)
            v = qkv[0, :, 2 * nk:].reshape(1, T, len(vh), K)
            g, beta = gdn.gates(a[None], b[None], W[p + "A_log"][vh], W[p + "dt_bias"][vh], backend=be, policy=pol,
                                fallback=_HELPER_FALLBACK)
            fn = gdn.chunked if T > 1 else gdn.recurrent
            o, S = fn(q, k, v, g, beta, initial_state=cache.get(("state", i, r)), qk_l2norm=True,
                      backend=be, policy=pol)
            cache[("state", i, r)] = S
            for name, t in (("q", q[0]), ("k", k[0]), ("v", v[0]), ("g", g[0]), ("beta", beta[0])):
                tape.add(t, rank=r, layer=i, op="gdn", name=name, tokens=True)
            tape.add(o[0], rank=r, layer=i, op="gdn", name="core", tokens=True)
            tape.add(S[0], rank=r, layer=i, op="gdn", name="state")
            if tape.spec.conv_state:  # the rolling conv window, q/k/v channels apart (each splits its own way)
                cs = cache[("conv", i, r)][0]
                for name, part in (("conv_state_q", cs[:nk]), ("conv_state_k", cs[nk:2 * nk]), ("conv_state_v", cs[2 * nk:])):
                    tape.add(part, rank=r, layer=i, op="gdn", name=name)
            y = gdn.gated_rmsnorm(o[0], z.reshape(T, len(vh), K), W[p + "gnorm"], c.eps, backend=be, policy=pol,
                                  fallback=_HELPER_FALLBACK)
            parts.append(self._mm(y.reshape(T, -1), W[p + "o"][:, vr], arm, i, r, name="gdn.o"))
        return self._all_reduce(parts)

    def _qsa(self, i: int, xn: torch.Tensor, arm: ArmConfig, cache: dict, tape: _Tape) -> torch.Tensor:
        c, W, p = self.config, self.weights, f"layers.{i}."
        HQ, HKV, Dh, HI, Di = c.qsa_q_heads, c.qsa_kv_heads, c.qsa_head_dim, c.index_heads, c.index_dim
        T = xn.shape[0]
        parts = []
        for r in range(arm.tp):
            qh = list(_part(HQ, arm.tp, r, "qsa_q_heads"))
            # KV heads: shard when there are enough, else replicate the one(s) this rank's q heads read
            kvh = sorted({h // (HQ // HKV) for h in qh})
            pol = arm.policy("qsa", i, r)
            be = arm.backend("qsa")
            q = self._mm(xn, W[p + "q"][_rows(qh, Dh)], arm, i, r, name="qsa.q").reshape(T, len(qh), Dh)
            gate = self._mm(xn, W[p + "gate"][_rows(qh, Dh)], arm, i, r, name="qsa.gate").reshape(T, len(qh), Dh)
            k = self._mm(xn, W[p + "k"][_rows(kvh, Dh)], arm, i, r, name="qsa.k").reshape(T, len(kvh), Dh)
            v = self._mm(xn, W[p + "v"][_rows(kvh, Dh)], arm, i, r, name="qsa.v").reshape(T, len(kvh), Dh)
            iq = self._mm(xn, W[p + "iq"], arm, i, r, name="qsa.iq").reshape(T, HI, Di)
            ik = self._mm(xn, W[p + "ik"], arm, i, r, name="qsa.ik")
            for name, t in (("k", k), ("v", v), ("ik", ik)):
                key = (name, i, r)
                cache[key] = t if key not in cache else torch.cat([cache[key], t])
            K_all, V_all, IK_all = cache[("k", i, r)], cache[("v", i, r)], cache[("ik", i, r)]
            n = K_all.shape[0]
            pos = torch.arange(n - T, n)
            bk = qsa.block_keys(IK_all[None], ratio=c.ratio, policy=pol, backend=be, fallback=_HELPER_FALLBACK)
            scores = qsa.index_scores(iq, bk.expand(T, -1, -1), pos=pos, ratio=c.ratio, policy=pol, backend=be,
                                      fallback=_HELPER_FALLBACK)
            idx = qsa.select(scores, budget=c.budget, ratio=c.ratio, pos=pos, backend=be, fallback=_HELPER_FALLBACK)
            kv = qsa.PagedKVCache.from_dense(K_all[None], V_all[None], page_size=c.ratio, seed=arm.page_seed)
            table = kv.block_table.expand(T, -1).contiguous()
            L = idx.shape[1]
            S = max(1, min(pol.num_kv_splits, L))
            P = -(-L // S)
            o_parts, lse_parts = [], []
            for s in range(S):  # one split-KV partition per call: its partial state is observable
                o_s, lse_s = qsa.sparse_decode(q, kv, table, idx[:, s * P:(s + 1) * P].contiguous(),
                                               num_splits=1, policy=pol, backend=be)
                o_parts.append(o_s.float())
                lse_parts.append(lse_s)
            o_parts = torch.stack(o_parts, -2)
            lse_parts = torch.stack(lse_parts, -1)
            o, lse = qsa.merge_states(o_parts, lse_parts, policy=pol, backend=be)
            gated = qsa.output_gate(o.float(), gate, policy=pol, backend=be, fallback=_HELPER_FALLBACK)
            full = tape.qsa_cache  # what a replay of the sparse decode reads, at the chosen steps
            for name, t in (("q", q), ("k", k), ("v", v), ("gate", gate), ("index_scores", scores),
                            ("indices", idx), ("partial_o", o_parts), ("partial_lse", lse_parts),
                            ("o", o), ("lse", lse), ("gated", gated)):
                tape.add(t, rank=r, layer=i, op="qsa", name=name, tokens=True,
                         force=full and name in ("q", "indices", "o", "lse"))
            if full:
                tape.add(table, rank=r, layer=i, op="qsa", name="block_table", tokens=True, force=True)
                for name, t in (("k_cache", kv.k), ("v_cache", kv.v)):
                    tape.add(t, rank=r, layer=i, op="qsa", name=name, force=True)
            parts.append(self._mm(gated.reshape(T, -1).float(), W[p + "o"][:, _rows(qh, Dh)], arm, i, r, name="qsa.o"))
        return self._all_reduce(parts)

    def _mlp(self, i: int, xn: torch.Tensor, arm: ArmConfig, tape: "_Tape | None" = None) -> torch.Tensor:
        W, p = self.weights, f"layers.{i}."
        rec = tape is not None and i in tape.spec.mlp_detail and tape.detail
        # the weights once, with the prefill's last chunk (step 0 when the prompt is prefilled whole)
        first = rec and tape.rows is not None and tape.rows[0] + xn.shape[0] == tape.rows[1]
        if rec:
            tape.add(xn, rank=0, layer=i, op="mlp", name="input", tokens=True)
        parts = []
        for r in range(arm.tp):
            f = torch.tensor(list(_part(self.config.d_ff, arm.tp, r, "d_ff")))
            gate = self._mm(xn, W[p + "mlp_gate"][f], arm, i, r, name="mlp.gate")
            up = self._mm(xn, W[p + "mlp_up"][f], arm, i, r, name="mlp.up")
            h = torch.nn.functional.silu(gate) * up
            parts.append(self._mm(h, W[p + "mlp_down"][:, f], arm, i, r, name="mlp.down"))
            if rec:
                for name, t in (("gate", gate), ("up", up), ("act", h), ("partial", parts[-1])):
                    tape.add(t, rank=r, layer=i, op="mlp", name=name, tokens=True)
            if first:  # the weights this rank holds (bf16-representable: stored as bf16, exactly)
                for name, t in (("w_gate", W[p + "mlp_gate"][f]), ("w_up", W[p + "mlp_up"][f]),
                                ("w_down", W[p + "mlp_down"][:, f])):
                    tape.add(t.to(torch.bfloat16), rank=r, layer=i, op="mlp", name=name)
        return self._all_reduce(parts)

    # -- a step -----------------------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, arm: ArmConfig, cache: dict, tape: _Tape,
                logits_out: list | None = None) -> torch.Tensor:
        """One step over ``tokens`` ``[T]``; returns the sampled token ``[1]`` int64 (and appends the
        materialized logits ``[1, V]`` to ``logits_out`` when given)."""
        c, W = self.config, self.weights
        x = W["embed"][tokens]
        for i in range(c.n_layers):
            kind = c.layer_kind(i)
            tape.add(x, rank=0, layer=i, op=kind, name="input", tokens=True)
            xn = self._rms(x, W[f"layers.{i}.attn_norm"])
            mixer = self._gdn if kind == "gdn" else self._qsa
            y = mixer(i, xn, arm, cache, tape)
            tape.add(y, rank=0, layer=i, op=kind, name="output", tokens=True)
            x = x + y
            m = self._mlp(i, self._rms(x, W[f"layers.{i}.mlp_norm"]), arm, tape)
            tape.add(m, rank=0, layer=i, op="mlp", name="output", tokens=True)
            x = x + m
            tape.add(x, rank=0, layer=i, op="layer", name="output", tokens=True)
        h = self._rms(x[-1:], W["final_norm"])
        tape.add(h, rank=0, layer=-1, op="lm_head", name="input")
        pol = arm.policy("lm_head")
        logits = gemm.splitk_matmul(h, W["lm_head"], policy=pol, backend=arm.backend("lm_head"),
                                    out_dtype="fp32").to(_torch_dtype(pol.logits_dtype))
        tape.add(logits, rank=0, layer=-1, op="lm_head", name="logits")
        if logits_out is not None:
            logits_out.append(logits)
        if arm.sampler == "greedy":
            tok = sampling.greedy(logits)
        else:
            u = torch.rand((), generator=torch.Generator().manual_seed(arm.draw_seed * 100003 + tape.draw))
            tok = sampling.stateless_draw(sampling.softmax(logits), float(u))
        tape.add(tok, rank=0, layer=-1, op="sampler", name="token")
        return tok

    def generate(self, prompt: torch.Tensor, *, steps: int, arm: ArmConfig, writer=None,
                 spec: RecordSpec | None = None) -> list[int]:
        """Prefill ``prompt`` (step 0; steps 0..c-1 in chunks with ``arm.prefill_chunk``), then
        ``steps`` decode steps; returns the sampled tokens.

        Parameters
        ----------
        prompt: ``[T]`` int64 token ids
        steps: decode steps after the prefill (the result has ``steps + 1`` tokens)
        arm: the arm configuration
        writer: a CaptureWriter to record into (None: nothing is recorded)
        spec: what to record (default :class:`RecordSpec`)
        """
        tape = _Tape(writer, spec or RecordSpec())
        cache: dict = {}
        if writer is not None and tape.spec.lm_head_weight:
            writer.add(self.weights["lm_head"], rank=0, step=0, layer=-1, op="lm_head",
                       name="weight")
        out = []
        T = int(prompt.shape[0])
        c = arm.prefill_chunk or T
        calls = [(a, prompt[a:a + c]) for a in range(0, T, c)]  # the prefill, in one call or in chunks
        rid = None
        if writer is not None and tape.spec.batch_rows:
            from workbench.capture.align import prompt_id

            rid = prompt_id(prompt.tolist())
        with torch.no_grad():
            for step in range(len(calls) + steps):
                tape.step = step
                tape.draw = step - len(calls) + 1
                tape.rows = (calls[step][0], T) if step < len(calls) else None
                a, tokens = calls[step] if step < len(calls) else (T + step - len(calls), tokens)
                if rid is not None:
                    writer.add_batch(step, requests=[rid] * int(tokens.shape[0]), positions=range(a, a + int(tokens.shape[0])))
                tok = self.forward(tokens, arm, cache, tape)
                if step >= len(calls) - 1:  # a chunk before the last samples nothing
                    out.append(int(tok))
                tokens = tok.reshape(1)
        return out


    def score(self, prompt: torch.Tensor, continuation, *, arm: ArmConfig) -> np.ndarray:
        """Teacher-forced negative log-likelihood (nats) of each token of ``continuation`` under
        ``arm``: the prompt is prefilled (in chunks with ``arm.prefill_chunk``), then the
        continuation's tokens are fed one decode step each whatever the arm would have sampled; the
        NLL is the FP64 log-softmax of the logits the arm materializes (``lm_head.logits_dtype``).

        Returns ``[len(continuation)]`` float64.
        """
        cont = [int(t) for t in continuation]
        if not cont:
            return np.zeros(0)
        tape = _Tape(None, RecordSpec())
        cache: dict = {}
        T = int(prompt.shape[0])
        c = arm.prefill_chunk or T
        calls = [prompt[a:a + c] for a in range(0, T, c)] + [torch.tensor([t]) for t in cont[:-1]]
        logits: list = []
        with torch.no_grad():
            for step, toks in enumerate(calls):
                tape.step = step
                tape.draw = step - (len(calls) - len(cont) + 1) + 1
                tape.rows = None
                self.forward(toks, arm, cache, tape, logits_out=logits)
        rows = torch.cat(logits[-len(cont):]).double()
        lp = torch.log_softmax(rows, -1)
        return (-lp[torch.arange(len(cont)), torch.tensor(cont)]).numpy()


def _torch_dtype(name: str) -> torch.dtype:
    from workbench.numerics.dtypes import torch_dtype
    return torch_dtype(name)


class HybridRerun:
    """``rerun(overrides) -> Capture`` for :class:`workbench.models.hybrid.HybridDecoder`.

    Runs ``model.generate(prompt, steps=steps, arm=arm)`` into a fresh capture (every prefill
    position recorded, so a graft at step 0 replaces whole tensors) through a writer that copies
    each override into the recorded tensor in place before writing it. The model goes on with
    that tensor only where it reads it after recording it: the layer inputs and outputs
    (``<op>/input``, ``<op>/output``, ``mlp/output``, ``layer/output``), ``gdn/core``,
    ``gdn/state`` and ``qsa/gated``; grafting any other name raises GraftError.

    Example
    -------
    >>> from workbench.models.hybrid import ArmConfig, HybridConfig, HybridDecoder
    >>> model = HybridDecoder(HybridConfig(n_layers=4, vocab=64))
    >>> run = HybridRerun(model, ArmConfig(name="c"), model.prompt(16), steps=1)
    >>> cap = run({})
    >>> sorted(cap.index["step"].unique().tolist())
    [0, 1]
    """

    LIVE = ("input", "output", "core", "state", "gated")

    def __init__(self, model, arm, prompt: torch.Tensor, *, steps: int = 1, spec=None,
                 workdir: str | Path | None = None) -> None:
        self.model, self.arm, self.prompt, self.steps = model, arm, prompt, steps
        self.spec = spec or RecordSpec(detail_steps=None, prefill_positions=None)
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="workbench-graft-")
        self.workdir = Path(workdir) if workdir is not None else Path(self._tmp.name)
        self.runs = 0

    def __call__(self, overrides: Mapping[tuple, torch.Tensor]):
        from workbench.capture.format import KEY_FIELDS
        from workbench.capture.reader import open_capture
        from workbench.capture.writer import CaptureWriter
        for k in overrides:
            if len(k) != len(KEY_FIELDS) or k[4] not in self.LIVE:
                raise GraftError(f"cannot graft {k!r} into the hybrid decoder", key="overrides",
                                 fix=f"graft a tensor named one of {list(self.LIVE)} (the model reads "
                                         "the others before recording them)")
        self.runs += 1
        path = self.workdir / f"run-{self.runs}"
        w = CaptureWriter(path, arm=self.arm.name, run={"graft": [list(k) for k in overrides]}, overwrite=True)
        pending = dict(overrides)

        class _Grafting:
            def add(_self, t, *, rank, step, layer, op, name, **tags):
                k = (rank, step, layer, op, name)
                if k in pending:
                    v = pending.pop(k)
                    if v.shape != t.shape:
                        raise GraftError(f"override of {k} has shape {tuple(v.shape)}, the model produces "
                                         f"{tuple(t.shape)}", key="overrides",
                                         fix="take overrides from a run with the same spec (all prefill positions)")
                    with torch.no_grad():
                        t.copy_(v.to(t.dtype))
                w.add(t, rank=rank, step=step, layer=layer, op=op, name=name, **tags)

        from workbench.kernels.registry import kernel_log
        try:
            with kernel_log() as log:
                self.model.generate(self.prompt, steps=self.steps, arm=self.arm, writer=_Grafting(), spec=self.spec)
        except BaseException:
            w.abort()
            raise
        w.run = {**w.run, "kernels": log.summary()}
        w.close()
        if pending:
            raise GraftError(f"the run never produced {sorted(pending)}", key="overrides",
                             fix="check the keys against the control capture's index")
        cap = open_capture(path)
        cap._workdir = self._tmp  # the temporary directory lives as long as a capture in it
        return cap


def rerun_from_capture(cap, *, steps: int) -> "HybridRerun | None":
    """A :class:`HybridRerun` of the run a bundled-decoder capture recorded (its config, arm and
    prompt from ``run``), or None when the capture is not of the base hybrid decoder (another
    model, or the tie/split-K models whose weights were edited)."""
    run = getattr(cap, "run", None) or {}
    if not str(run.get("model", "")).endswith("hybrid.HybridDecoder") or "tie" in run or "splitk" in run:
        return None
    try:
        cfg = HybridConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in run["config"].items()})
        arm = ArmConfig.from_dict(run["arm"])
        model = HybridDecoder(cfg)
        prompt = model.prompt(int(run["prompt"]["length"]), seed=int(run["prompt"]["seed"]))
    except (KeyError, TypeError, ValueError):
        return None
    return HybridRerun(model, arm, prompt, steps=steps)
