"""Block ids of the KV pool: reference counts and the free list in eviction order.

The KV tensors themselves are one preallocated tensor per layer, owned by the model runner and
indexed by these ids; nothing here touches them.

Invariants:
- a block is in the free list iff its ref count is 0;
- the free list is ordered oldest-freed first: `allocate` takes from the head, `free` appends to
  the tail, so cached blocks that were released longest ago are evicted first (LRU);
- a free block may still hold a cached prefix (the prefix cache knows which); allocating it
  evicts that entry through `on_evict`.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterable


class NoFreeBlocksError(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int, on_evict: Callable[[int], None] | None = None) -> None:
        if num_blocks < 1:
            raise ValueError("the KV pool needs at least one block")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._on_evict = on_evict

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def free_block_ids(self) -> list[int]:
        """The free list, next to be evicted first (for tests and metrics)."""
        return list(self._free)

    def allocate(self, num: int) -> list[int]:
        if num > len(self._free):
            raise NoFreeBlocksError(f"asked for {num} blocks, {len(self._free)} free")
        block_ids = []
        for _ in range(num):
            block_id, _ = self._free.popitem(last=False)
            if self._on_evict is not None:
                self._on_evict(block_id)
            self._ref_counts[block_id] = 1
            block_ids.append(block_id)
        return block_ids

    def touch(self, block_ids: Iterable[int]) -> None:
        """Take one more reference on blocks found in the prefix cache (free or in use)."""
        for block_id in block_ids:
            if self._ref_counts[block_id] == 0:
                del self._free[block_id]
            self._ref_counts[block_id] += 1

    def free(self, block_ids: Iterable[int]) -> None:
        """Drop one reference each; blocks reaching zero go to the tail of the free list in the
        order given (callers pass a sequence's blocks last-first, so its tail is evicted first)."""
        for block_id in block_ids:
            count = self._ref_counts[block_id]
            if count <= 0:
                raise RuntimeError(f"block {block_id} freed more often than allocated")
            self._ref_counts[block_id] = count - 1
            if count == 1:
                self._free[block_id] = None
