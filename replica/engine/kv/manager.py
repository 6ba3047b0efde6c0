"""The KV cache manager: match / allocate / free. Hands the scheduler block tables only.

Invariants:
- `block_table(request)` covers at least `request.num_computed_tokens` tokens;
- a block in any table has a ref count >= 1; a block shared through the prefix cache is counted
  once per table holding it;
- only full blocks whose tokens are computed are ever inserted into the prefix cache.
"""
from __future__ import annotations

from replica.engine.kv.block_hash import hash_full_blocks
from replica.engine.kv.block_pool import BlockPool
from replica.engine.kv.prefix_cache import PrefixCache
from replica.engine.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.prefix_cache = PrefixCache()
        self.pool = BlockPool(num_blocks, on_evict=self.prefix_cache.evict)
        self._tables: dict[str, list[int]] = {}
        self._num_cached_blocks: dict[str, int] = {}  # leading blocks already in the prefix cache

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_free_uncached_blocks(self) -> int:
        """Free blocks that hold no cached prefix: what a request can take without evicting
        one (O(cached blocks); for stats, not the scheduler)."""
        pool = self.pool
        return pool.num_free_blocks - sum(
            1 for b in self.prefix_cache.block_ids() if pool.ref_count(b) == 0)

    def block_table(self, request_id: str) -> list[int]:
        return self._tables.get(request_id, [])

    def _hashes(self, request: Request) -> list[int]:
        num_full = request.num_tokens // self.block_size
        if len(request.block_hashes) < num_full:
            request.block_hashes = hash_full_blocks(
                request.token_ids, self.block_size, request.cache_salt, request.block_hashes
            )
        return request.block_hashes

    def match(self, request: Request) -> list[int]:
        """Cached blocks for the longest prefix of `request`, without taking references.

        At least one token is always left to compute, since the step that computes it yields
        the logits for the next token."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._hashes(request)
        token_ids = request.token_ids
        block_ids: list[int] = []
        for i, block_hash in enumerate(hashes[:max_blocks]):
            start = i * self.block_size
            block_id = self.prefix_cache.match(block_hash, token_ids[start : start + self.block_size])
            if block_id is None:
                break
            block_ids.append(block_id)
        return block_ids

    def can_allocate(self, request: Request, num_new_tokens: int, cached_block_ids: list[int] = ()) -> bool:
        return self._num_blocks_needed(request, num_new_tokens, cached_block_ids) <= self.pool.num_free_blocks

    def _num_blocks_needed(self, request: Request, num_new_tokens: int, cached_block_ids) -> int:
        table = self._tables.get(request.request_id, [])
        num_computed = request.num_computed_tokens + len(cached_block_ids) * self.block_size
        needed = cdiv(num_computed + num_new_tokens, self.block_size) - len(table) - len(cached_block_ids)
        # cached blocks that sit in the free list leave it when touched
        num_free_cached = sum(1 for b in cached_block_ids if self.pool.ref_count(b) == 0)
        return max(needed, 0) + num_free_cached

    def allocate(self, request: Request, num_new_tokens: int, cached_block_ids: list[int] = ()) -> bool:
        """Grow `request`'s table to hold its computed tokens plus `num_new_tokens`.

        `cached_block_ids` (from `match`, only for a request with nothing computed yet) are
        appended first and count as computed. Returns False, changing nothing, if the pool is
        short of blocks."""
        if self._num_blocks_needed(request, num_new_tokens, cached_block_ids) > self.pool.num_free_blocks:
            return False
        table = self._tables.setdefault(request.request_id, [])
        if cached_block_ids:
            assert request.num_computed_tokens == 0 and not table
            self.pool.touch(cached_block_ids)
            table.extend(cached_block_ids)
            request.num_computed_tokens = len(cached_block_ids) * self.block_size
            self._num_cached_blocks[request.request_id] = len(cached_block_ids)
        needed = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - len(table)
        if needed > 0:
            table.extend(self.pool.allocate(needed))
        return True

    def cache_full_blocks(self, request: Request) -> None:
        """Offer the request's newly computed full blocks to the prefix cache."""
        if not self.enable_prefix_caching:
            return
        num_full = request.num_computed_tokens // self.block_size
        done = self._num_cached_blocks.get(request.request_id, 0)
        if num_full <= done:
            return
        hashes = self._hashes(request)
        table = self._tables[request.request_id]
        token_ids = request.token_ids
        for i in range(done, num_full):
            start = i * self.block_size
            self.prefix_cache.insert(hashes[i], table[i], token_ids[start : start + self.block_size])
        self._num_cached_blocks[request.request_id] = num_full

    def free(self, request: Request) -> None:
        table = self._tables.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        self.pool.free(reversed(table))
