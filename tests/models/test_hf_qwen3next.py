"""The tiny Hugging Face Qwen3-Next and the workbench GDN patched into it."""

import pytest
import torch

from workbench.models import hf_qwen3next as hq
from workbench.numerics.metrics import compare


@pytest.fixture(scope="module")
def model():
    return hq.build_model()


def _modeling():
    from transformers.models.qwen3_next import modeling_qwen3_next as m
    return m


def test_patch_is_restored_also_after_an_error():
    m = _modeling()
    before = (m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule)
    with hq.workbench_gdn():
        assert m.torch_chunk_gated_delta_rule.__name__ == "workbench_chunked"
        assert m.torch_recurrent_gated_delta_rule.__name__ == "workbench_recurrent"
    assert (m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule) == before
    with pytest.raises(ValueError), hq.workbench_gdn():
        raise ValueError("boom")
    assert (m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule) == before


def test_workbench_gdn_matches_the_model_within_fp32_noise(model):
    ids = hq.prompt_ids()
    with torch.no_grad():
        ref = model(ids).logits
        with hq.workbench_gdn(backend="torch"):
            got = model(ids).logits
        assert not torch.equal(ref, got)  # the patch is really in the path
        assert compare(ref, got).rel_l2 < 1e-5
        ref_gen = model.generate(ids, max_new_tokens=3, do_sample=False)
        with hq.workbench_gdn(backend="oracle"):
            got_gen = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert torch.equal(ref_gen, got_gen)
