"""The paged KV cache of QSA decode, its validation and the order in which pages are visited.

Layout (one layer)
------------------
k_cache, v_cache: ``[num_pages, page_size, HKV, D]`` (fp32, bf16 or fp16); page ``p`` holds
    ``page_size`` consecutive tokens of one sequence. ``page_size`` equals the indexer block
    ratio (4 by default) so one indexer block is one page.
block_table: ``[B, max_pages]`` int32; ``block_table[b, j]`` is the physical page holding logical
    tokens ``j * page_size ... (j + 1) * page_size - 1`` of sequence ``b`` (-1: no page).
indices: ``[B, L]`` int32 logical token positions (``L = budget + ratio - 1`` from
    :func:`~workbench.kernels.qsa.select`), ``-1`` for padding. The physical slot of logical
    token ``t`` is ``block_table[b, t // page_size] * page_size + t % page_size``.
q: ``[B, HQ, D]``; query head ``h`` reads KV head ``h // (HQ // HKV)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.errors import KernelArgumentError

__all__ = ["PagedKVCache", "visit_slots", "check_decode_args", "unpack_cache"]

_FLOATS = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
_INTS = (torch.int32, torch.int64)


@dataclass(frozen=True)
class PagedKVCache:
    """A paged KV cache: ``k``/``v`` ``[num_pages, page_size, HKV, D]`` plus ``block_table``
    ``[B, max_pages]`` int32 and ``seqlens`` ``[B]`` int32 (tokens stored per sequence).

    Example
    -------
    >>> k = torch.randn(2, 10, 1, 8); v = torch.randn(2, 10, 1, 8)
    >>> cache = PagedKVCache.from_dense(k, v, page_size=4, seed=0)
    >>> moved = cache.relocate(seed=1)           # same tokens, new physical pages
    >>> torch.equal(moved.dense()[0], cache.dense()[0])
    True
    """

    k: torch.Tensor
    v: torch.Tensor
    block_table: torch.Tensor
    seqlens: torch.Tensor

    @property
    def page_size(self) -> int:
        return int(self.k.shape[1])

    @property
    def num_pages(self) -> int:
        return int(self.k.shape[0])

    @classmethod
    def from_dense(cls, k: torch.Tensor, v: torch.Tensor, *, page_size: int = 4,
                   seqlens: torch.Tensor | None = None, num_pages: int | None = None,
                   seed: int | None = None) -> "PagedKVCache":
        """Page dense ``k``/``v`` ``[B, T, HKV, D]``.

        Pages are assigned in sequence order (b, then logical page) unless ``seed`` is given, in
        which case the physical pages are a random permutation (an allocator that has been running
        for a while). ``num_pages`` >= the pages needed leaves free pages (zeros).
        """
        B, T, H, D = k.shape
        if v.shape != k.shape:
            raise KernelArgumentError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}",
                                      key="v", fix="pass k and v of equal shape [B, T, HKV, D]")
        seqlens = torch.full((B,), T, dtype=torch.int32) if seqlens is None else seqlens.to(torch.int32).cpu()
        per = -(-T // page_size)
        need = B * per
        num_pages = need if num_pages is None else num_pages
        if num_pages < need:
            raise KernelArgumentError(f"num_pages must be >= {need} to hold B={B} x {per} pages, got {num_pages}",
                                      key="num_pages", fix=f"pass num_pages >= {need} or None")
        order = torch.arange(num_pages) if seed is None else torch.randperm(
            num_pages, generator=torch.Generator().manual_seed(seed))
        kp = k.new_zeros((num_pages, page_size, H, D))
        vp = v.new_zeros((num_pages, page_size, H, D))
        table = torch.full((B, per), -1, dtype=torch.int32)
        pad = per * page_size - T
        kpad = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, pad)).reshape(B, per, page_size, H, D)
        vpad = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, pad)).reshape(B, per, page_size, H, D)
        n = 0
        for b in range(B):
            used = -(-int(seqlens[b]) // page_size)
            for j in range(used):
                p = int(order[n]); n += 1
                table[b, j] = p
                kp[p] = kpad[b, j]
                vp[p] = vpad[b, j]
        return cls(kp, vp, table.to(k.device), seqlens.to(k.device))

    def relocate(self, perm: torch.Tensor | None = None, *, seed: int | None = 0) -> "PagedKVCache":
        """Move every physical page ``p`` to ``perm[p]`` and rewrite the block table to match.

        ``perm`` is a permutation of ``range(num_pages)``; without it a random one is drawn from
        ``seed``. The logical content (what :meth:`dense` returns) is unchanged.
        """
        n = self.num_pages
        if perm is None:
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        perm = torch.as_tensor(perm, dtype=torch.int64).cpu()
        if perm.shape != (n,) or not torch.equal(perm.sort().values, torch.arange(n)):
            raise KernelArgumentError(f"perm must be a permutation of range({n})", key="perm",
                                      fix="pass torch.randperm(cache.num_pages) or seed=")
        dev = self.k.device
        k = torch.empty_like(self.k); v = torch.empty_like(self.v)
        k[perm.to(dev)] = self.k
        v[perm.to(dev)] = self.v
        bt = self.block_table.to(torch.int64).cpu()
        table = torch.where(bt >= 0, perm[bt.clamp(min=0)], bt).to(torch.int32).to(self.block_table.device)
        return PagedKVCache(k, v, table, self.seqlens)

    def dense(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Dense ``k``, ``v`` ``[B, max_pages * page_size, HKV, D]`` (zeros where no page)."""
        B, P = self.block_table.shape
        bt = self.block_table.long()
        k = self.k[bt.clamp(min=0)] * (bt >= 0)[..., None, None, None]
        v = self.v[bt.clamp(min=0)] * (bt >= 0)[..., None, None, None]
        return (k.reshape(B, P * self.page_size, *self.k.shape[2:]),
                v.reshape(B, P * self.page_size, *self.v.shape[2:]))

    def gather(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tokens listed by ``indices`` ``[B, L]``: ``k``, ``v`` ``[B, L, HKV, D]`` and the valid mask."""
        slots = physical_slots(self.block_table, indices, self.page_size)
        valid = slots >= 0
        flat_k = self.k.reshape(-1, *self.k.shape[2:])
        flat_v = self.v.reshape(-1, *self.v.shape[2:])
        return flat_k[slots.clamp(min=0)], flat_v[slots.clamp(min=0)], valid


def unpack_cache(kv_cache) -> tuple[torch.Tensor, torch.Tensor]:
    """``(k_cache, v_cache)`` from a PagedKVCache or a pair of tensors."""
    if isinstance(kv_cache, PagedKVCache):
        return kv_cache.k, kv_cache.v
    if isinstance(kv_cache, (tuple, list)) and len(kv_cache) == 2:
        return kv_cache[0], kv_cache[1]
    raise KernelArgumentError(
        f"kv_cache must be a PagedKVCache or a (k_cache, v_cache) pair, got {type(kv_cache).__name__}",
        key="kv_cache", fix="pass (k_cache, v_cache) with shapes [num_pages, page_size, HKV, D]")


def physical_slots(block_table: torch.Tensor, indices: torch.Tensor, page_size: int) -> torch.Tensor:
    """Physical slot (page * page_size + offset) of every listed token, -1 for padding. int64."""
    idx = indices.long()
    valid = idx >= 0
    page = torch.where(valid, idx // page_size, 0)
    phys = block_table.long().gather(1, page)
    slot = phys * page_size + torch.where(valid, idx % page_size, 0)
    return torch.where(valid, slot, torch.full_like(slot, -1))


def visit_slots(block_table: torch.Tensor, indices: torch.Tensor, page_size: int,
                page_order: str) -> torch.Tensor:
    """Physical slots ``[B, L]`` int64 in the order the kernel visits them (-1 last).

    ``"logical"``: the order of ``indices`` (what the math says; independent of where pages sit).
    ``"physical"``: ascending physical slot, ties (duplicates) in list order, padding last; this is
    an allocator-order dependence, since relocating pages changes which tokens share a split and
    the order they are summed in.
    """
    slots = physical_slots(block_table, indices, page_size)
    if page_order == "logical":
        return slots
    key = torch.where(slots >= 0, slots, torch.full_like(slots, torch.iinfo(torch.int64).max))
    order = torch.sort(key, dim=1, stable=True).indices
    return slots.gather(1, order)


def _err(arg: str, expected: str, got, fix: str) -> KernelArgumentError:
    return KernelArgumentError(f"{arg} must be {expected}, got {got}", key=arg, fix=fix)


def check_decode_args(q, k_cache, v_cache, block_table, indices, num_splits, *, check: bool | None = None) -> None:
    """Validate sparse_decode's arguments; raises KernelArgumentError naming the argument.

    Shapes, dtypes and devices are always checked (host metadata: free, and allowed under CUDA
    graph capture). The values of ``indices`` and ``block_table`` (tokens in range, on allocated
    pages) are read only when ``check`` says so: None (default) checks them on CPU tensors, where
    reading them costs nothing, and not on CUDA tensors, where reading them would synchronize the
    device and forbid graph capture; True checks them anywhere (a debug mode; an error while a
    CUDA graph is captured); False never."""
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _FLOATS:
            raise _err(name, "a float tensor (fp32, bf16, fp16 or fp64)",
                       getattr(t, "dtype", type(t).__name__), f"convert {name} with .to(torch.bfloat16)")
    if q.dim() != 3:
        raise _err("q", "3-D [B, HQ, D]", f"shape {tuple(q.shape)}", "pass one decode token per sequence")
    if k_cache.dim() != 4:
        raise _err("k_cache", "4-D [num_pages, page_size, HKV, D]", f"shape {tuple(k_cache.shape)}",
                   "see workbench.kernels.qsa.PagedKVCache")
    if v_cache.shape != k_cache.shape:
        raise _err("v_cache", f"k_cache's shape {tuple(k_cache.shape)}", f"{tuple(v_cache.shape)}",
                   "pass k and v caches of one layout")
    if k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise _err("k_cache", f"q's dtype {q.dtype}", f"k_cache {k_cache.dtype}, v_cache {v_cache.dtype}",
                   "materialize q, k_cache and v_cache in one dtype")
    B, HQ, D = q.shape
    _, page_size, HKV, Dk = k_cache.shape
    if Dk != D:
        raise _err("k_cache", f"head dim D={D} (q's)", f"D={Dk}", "use caches of the model's head dim")
    if HKV < 1 or HQ % HKV:
        raise _err("q", f"a number of query heads divisible by the HKV={HKV} KV heads (mismatched heads)",
                   f"HQ={HQ}", "check the GQA head counts of q and the cache")
    for name, t in (("block_table", block_table), ("indices", indices)):
        if not isinstance(t, torch.Tensor) or t.dtype not in _INTS or t.dim() != 2:
            raise _err(name, "a 2-D int32 tensor",
                       f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}",
                       f"pass {name}.to(torch.int32) of shape [B, ...]")
        if t.shape[0] != B:
            raise _err(name, f"batch size B={B} rows (q's)", f"{t.shape[0]} rows", "pass one row per sequence")
        if t.device != q.device:
            raise _err(name, f"on q's device {q.device}", str(t.device), f"move {name} with .to(q.device)")
    if k_cache.device != q.device or v_cache.device != q.device:
        raise _err("k_cache", f"on q's device {q.device}", str(k_cache.device), "move the cache to q's device")
    if not isinstance(num_splits, int) or isinstance(num_splits, bool) or num_splits < 1:
        raise _err("num_splits", "a positive int", repr(num_splits), "pass num_splits=1 or more")
    if check is None:
        check = q.device.type == "cpu"
    if not check or indices.numel() == 0:
        return
    if q.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise _err("check", "False or None while a CUDA graph is captured (it reads indices on the host)",
                   "True", "validate the inputs once with check=True before capturing, then capture with check=None")
    lo = int(indices.min())
    if lo < -1:
        raise _err("indices", "logical token positions >= 0 or -1 (padding)", f"min {lo}",
                   "build indices with workbench.kernels.qsa.select")
    hi = int(indices.max())
    max_pages = block_table.shape[1]
    if hi >= max_pages * page_size:
        raise _err("block_table", f"at least {hi // page_size + 1} pages per row to cover token {hi} "
                   "(block table shorter than the pages used)", f"{max_pages} pages",
                   "extend the block table or drop tokens past the sequence from indices")
    slots = physical_slots(block_table, indices.clamp(max=max_pages * page_size - 1), page_size)
    used_pages = torch.where(indices >= 0, slots // page_size, 0)
    bad = (indices >= 0) & ((used_pages < 0) | (used_pages >= k_cache.shape[0]))
    if bool(bad.any()):
        b, j = (int(x) for x in bad.nonzero()[0])
        raise _err("indices", f"tokens on allocated pages (block_table entry in [0, {k_cache.shape[0]}))",
                   f"token {int(indices[b, j])} of row {b} on page entry "
                   f"{int(block_table[b, int(indices[b, j]) // page_size])}",
                   "drop tokens past the sequence length or fix the block table")
