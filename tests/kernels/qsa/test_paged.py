import pytest
import torch

from workbench.errors import KernelArgumentError
from workbench.kernels.qsa.paged import PagedKVCache, physical_slots, visit_slots


def _cache(seed=None, B=2, T=10):
    g = torch.Generator().manual_seed(0)
    return PagedKVCache.from_dense(torch.randn(B, T, 2, 8, generator=g), torch.randn(B, T, 2, 8, generator=g),
                                   page_size=4, seed=seed, num_pages=9)


def test_from_dense_round_trips():
    g = torch.Generator().manual_seed(0)
    k = torch.randn(2, 10, 2, 8, generator=g)
    c = PagedKVCache.from_dense(k, k + 1, page_size=4, seed=3)
    assert c.block_table.dtype == torch.int32 and c.block_table.shape == (2, 3)
    assert torch.equal(c.dense()[0][:, :10], k) and torch.equal(c.dense()[1][:, :10], k + 1)


def test_relocate_keeps_logical_content_and_moves_pages():
    c = _cache(seed=1)
    m = c.relocate(seed=5)
    assert not torch.equal(m.block_table, c.block_table)
    assert torch.equal(m.dense()[0], c.dense()[0]) and torch.equal(m.dense()[1], c.dense()[1])
    perm = torch.arange(9).flip(0)
    m2 = c.relocate(perm)
    assert torch.equal(m2.block_table.long(), perm[c.block_table.long()])


def test_relocate_rejects_non_permutation():
    with pytest.raises(KernelArgumentError, match="perm"):
        _cache().relocate(torch.zeros(9, dtype=torch.long))


def test_physical_slots_and_visit_order():
    bt = torch.tensor([[2, 0]], dtype=torch.int32)
    idx = torch.tensor([[5, 0, 4, -1, 1]], dtype=torch.int32)
    assert physical_slots(bt, idx, 4).tolist() == [[1, 8, 0, -1, 9]]
    assert visit_slots(bt, idx, 4, "logical").tolist() == [[1, 8, 0, -1, 9]]
    assert visit_slots(bt, idx, 4, "physical").tolist() == [[0, 1, 8, 9, -1]]
