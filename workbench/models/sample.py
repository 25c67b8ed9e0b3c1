"""The small torch model behind the bundled sample captures (``workbench samples``).

A 6-layer residual decoder over a 256-token vocabulary: each layer mixes tokens causally with an
exponential moving average carried as recurrent state across forward calls (so decode steps
depend on the prefix), then applies an RMSNorm'd SiLU MLP whose projections are split-K
matmuls. One forward call is one step: step 0 is a prefill of 16 tokens, steps 1..8 decode one
greedy token each.

Arms:
- ``control``: fp32, projections unsplit (splitk=1);
- ``control-repeat``: the A/A repeat: projections reduced in 2 K-slices, so every matmul result
  differs from the control by fp32 reassociation only (realistic run-to-run noise);
- ``candidate``: as the repeat, plus layer 3's MLP output rounded to bf16: the planted first
  divergence is ``layer=3 op=mlp.down name=output`` at step 0.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

__all__ = ["TinyDecoder", "generate", "write_samples", "ARMS", "PLANTED"]

VOCAB, D, HIDDEN, LAYERS, PROMPT, DECODE = 256, 64, 128, 6, 16, 8
PLANTED = {"rank": 0, "step": 0, "layer": 3, "op": "mlp.down", "name": "output"}


class SplitKLinear(nn.Module):
    """y = x W^T with K cut into ``splitk`` slices accumulated one after another in fp32."""

    def __init__(self, d_in: int, d_out: int, splitk: int = 1) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in))
        self.splitk = splitk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.splitk == 1:
            return x @ self.weight.T
        out = None
        for sl in torch.tensor_split(torch.arange(x.shape[-1]), self.splitk):
            part = x[..., sl] @ self.weight[:, sl].T
            out = part if out is None else out + part
        return out


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class EMAMixer(nn.Module):
    """Causal token mixing y_t = a y_{t-1} + (1 - a) x_t with the state kept across calls."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.decay = nn.Parameter(torch.empty(d))
        self.state: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.sigmoid(self.decay)
        s = self.state if self.state is not None else torch.zeros_like(x[:, 0])
        ys = []
        for t in range(x.shape[1]):
            s = a * s + (1 - a) * x[:, t]
            ys.append(s)
        self.state = s
        return torch.stack(ys, dim=1)


class MLP(nn.Module):
    def __init__(self, splitk: int, round_bf16: bool) -> None:
        super().__init__()
        self.up = SplitKLinear(D, HIDDEN, splitk)
        self.down = SplitKLinear(HIDDEN, D, splitk)
        self.round_bf16 = round_bf16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.up(x)))


class Block(nn.Module):
    def __init__(self, splitk: int, round_bf16: bool) -> None:
        super().__init__()
        self.mix = EMAMixer(D)
        self.norm = RMSNorm(D)
        self.mlp = MLP(splitk, round_bf16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mix(x)
        return x + self.mlp(self.norm(x))


class Sampler(nn.Module):
    """Greedy: the first maximum of the last position's logits."""

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return logits[:, -1].argmax(-1)


class TinyDecoder(nn.Module):
    def __init__(self, *, splitk: int = 1, bf16_layer: int | None = None, seed: int = 0) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Block(splitk, i == bf16_layer) for i in range(LAYERS))
        self.norm = RMSNorm(D)
        self.lm_head = SplitKLinear(D, VOCAB, splitk)
        self.sampler = Sampler()
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("decay"):
                    p.copy_(torch.randn(p.shape, generator=g))
                elif p.ndim == 2:
                    p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
        for blk in self.layers:
            if blk.mlp.round_bf16:
                blk.mlp.down.register_forward_hook(lambda m, i, o: o.bfloat16().float())

    def reset(self) -> None:
        for blk in self.layers:
            blk.mix.state = None

    def forward(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.embed(tokens)
        for blk in self.layers:
            x = blk(x)
        logits = self.lm_head(self.norm(x))
        return logits, self.sampler(logits)


def generate(model: TinyDecoder, *, seed: int = 1, prompt: int = PROMPT, steps: int = DECODE) -> list[int]:
    """Prefill a seeded random prompt, then decode ``steps`` greedy tokens (one forward each)."""
    model.reset()
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (1, prompt), generator=g)
    out = []
    with torch.no_grad():
        _, tok = model(tokens)
        for _ in range(steps):
            out.append(int(tok))
            _, tok = model(tok.view(1, 1))
    out.append(int(tok))
    return out


ARMS = {
    "control": dict(splitk=1, bf16_layer=None,
                    description="fp32 reference run; projections unsplit"),
    "control-repeat": dict(splitk=2, bf16_layer=None,
                           description="A/A repeat of the control: projections reduced in 2 K-slices "
                                       "(fp32 reassociation noise only); use as --aa"),
    "candidate": dict(splitk=2, bf16_layer=3,
                      description="candidate: as the repeat, plus layer 3's MLP output rounded to bf16"),
}


def write_samples(out: str | Path = "captures", *, overwrite: bool = False) -> list[Path]:
    """Record the three sample arms under ``out``; returns the capture paths."""
    from workbench.capture.recorder import record

    out = Path(out)
    paths = []
    for arm, cfg in ARMS.items():
        model = TinyDecoder(splitk=cfg["splitk"], bf16_layer=cfg["bf16_layer"]).eval()
        run = {
            "model": "workbench.models.sample.TinyDecoder",
            "description": cfg["description"],
            "config": {"splitk": cfg["splitk"], "bf16_layer": cfg["bf16_layer"], "layers": LAYERS,
                       "d_model": D, "vocab": VOCAB, "prompt": PROMPT, "decode_steps": DECODE},
            "regenerate": "workbench samples --out captures",
        }
        if arm == "candidate":
            run["expect"] = {"first_divergence": PLANTED,
                             "how": "workbench compare captures/control captures/candidate --aa captures/control-repeat"}
        path = out / arm
        if path.exists() and overwrite:
            import shutil
            shutil.rmtree(path)
        run["tokens"] = generate(model)  # an unrecorded pass: the greedy trajectory, for reference
        with record(model, path, arm=arm, run=run):
            generate(model)
        paths.append(path)
    return paths
