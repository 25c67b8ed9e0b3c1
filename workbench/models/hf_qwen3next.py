"""A tiny random Hugging Face Qwen3-Next (built from a config, nothing downloaded) and a context
manager that patches the workbench GDN kernels into its linear-attention layers.

``Qwen3NextGatedDeltaNet.forward`` calls the module-level functions
``torch_chunk_gated_delta_rule`` (prefill) and ``torch_recurrent_gated_delta_rule`` (decode) of
``transformers.models.qwen3_next.modeling_qwen3_next``; :func:`workbench_gdn` replaces both for
the duration of a ``with`` block and restores them in ``finally``.

Example
-------
>>> model = build_model()                                            # doctest: +SKIP
>>> with workbench_gdn(backend="torch"):                             # doctest: +SKIP
...     model.generate(prompt_ids(), max_new_tokens=4, do_sample=False)
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch

from workbench.kernels import gdn
from workbench.numerics.policy import Policy

__all__ = ["HF_CONFIG", "build_model", "prompt_ids", "workbench_gdn", "write_hf_capture", "HF_PROMPT", "HF_DECODE"]

HF_CONFIG = dict(
    vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    num_attention_heads=4, num_key_value_heads=1, head_dim=16,
    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
    linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
    shared_expert_intermediate_size=16, max_position_embeddings=512, pad_token_id=0)
HF_PROMPT, HF_DECODE, HF_SEED = 72, 4, 0  # 72 = a full chunk of 64 and a partial one
# what is recorded: each decoder layer, its linear-attention or attention block with their
# submodules, the MoE block as a whole, the final norm and the lm_head (not every expert)
HF_INCLUDE = ["model.layers.[0-9]", "model.layers.[0-9].linear_attn*", "model.layers.[0-9].self_attn*",
              "model.layers.[0-9].mlp", "model.norm", "lm_head"]


def build_model(seed: int = HF_SEED):
    """Qwen3NextForCausalLM from :data:`HF_CONFIG`, random weights from ``seed``, fp32, eval."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()  # "fast path not available" notices
    torch.manual_seed(seed)
    return Qwen3NextForCausalLM(Qwen3NextConfig(**HF_CONFIG)).float().eval()


def prompt_ids(length: int = HF_PROMPT, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, HF_CONFIG["vocab_size"], (1, length), generator=g)


def _adapter(fn, backend: str, policy: Policy | None):
    def gated_delta_rule(query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
                         use_qk_l2norm_in_kernel=False, **kwargs):
        dtype = query.dtype
        kw = {"chunk_size": chunk_size} if fn is gdn.chunked else {}
        init = None if initial_state is None else initial_state.float()
        o, state = fn(query.float(), key.float(), value.float(), g.float(), beta.float(), initial_state=init,
                      qk_l2norm=use_qk_l2norm_in_kernel, backend=backend, policy=policy, **kw)
        return o.to(dtype), (state.float() if output_final_state else None)
    gated_delta_rule.__name__ = f"workbench_{fn.__name__}"
    return gated_delta_rule


@contextlib.contextmanager
def workbench_gdn(*, backend: str = "torch", policy: Policy | None = None) -> Iterator[None]:
    """Run Qwen3-Next's linear attention through ``workbench.kernels.gdn`` inside the block.

    Prefill goes through :func:`gdn.chunked` (chunk 64, as the model's own), decode through
    :func:`gdn.recurrent`, with ``backend`` and ``policy``. The model's functions are restored on
    exit, also after an exception.
    """
    from transformers.models.qwen3_next import modeling_qwen3_next as m

    saved = m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule
    try:
        m.torch_chunk_gated_delta_rule = _adapter(gdn.chunked, backend, policy)
        m.torch_recurrent_gated_delta_rule = _adapter(gdn.recurrent, backend, policy)
        yield
    finally:
        m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule = saved


def write_hf_capture(c, path: Path, *, regenerate: str, arithmetic: dict | None = None) -> list[int]:
    """Record one HF arm of :data:`workbench.models.sample.CAPTURES` (``c.name`` ends with
    ``-control``: the model's own GDN; ``-candidate``: :func:`workbench_gdn`)."""
    import transformers

    from workbench.capture.recorder import record

    model = build_model()
    ids = prompt_ids()
    patched = c.name.endswith("-candidate")
    run = {"description": c.description, "model": "transformers Qwen3NextForCausalLM (tiny random config)",
           "config": HF_CONFIG, "seed": HF_SEED, "transformers": transformers.__version__,
           "prompt": {"length": HF_PROMPT, "seed": 1}, "decode_steps": HF_DECODE,
           "gdn": ("workbench.kernels.gdn chunked/recurrent, backend torch, default Policy" if patched
                   else "transformers torch_chunk_gated_delta_rule / torch_recurrent_gated_delta_rule"),
           "include": HF_INCLUDE, "regenerate": regenerate, "arithmetic": arithmetic or {}}
    if c.control is not None:
        run["compare_with"] = {"control": c.control, "aa": c.aa}
    if c.expect is not None:
        run["expect"] = {**c.expect, "how": f"workbench compare captures/{c.control} captures/{c.name}"}
    ctx = workbench_gdn(backend="torch", policy=Policy()) if patched else contextlib.nullcontext()
    with ctx, torch.no_grad(), record(model, path, arm=c.name, run=run, include=HF_INCLUDE, overwrite=True) as rec:
        out = model.generate(ids, max_new_tokens=HF_DECODE, do_sample=False, min_new_tokens=HF_DECODE)
        tokens = [int(t) for t in out[0, ids.shape[1]:]]
        rec.writer.run["tokens"] = tokens
    return tokens
