"""Full blocks keyed by their chained hash (see block_hash.py).

Every hit is checked against the token ids the block was filled with, so a hash collision can
never hand one sequence (or one tenant) another's KV. One hash maps to at most one block; a block
is cached under at most one hash.
"""
from __future__ import annotations

from typing import Sequence


class PrefixCache:
    def __init__(self) -> None:
        self._block_by_hash: dict[int, int] = {}
        self._entry_by_block: dict[int, tuple[int, tuple[int, ...]]] = {}  # block -> (hash, tokens)

    def match(self, block_hash: int, token_ids: Sequence[int]) -> int | None:
        block_id = self._block_by_hash.get(block_hash)
        if block_id is None:
            return None
        _, cached_tokens = self._entry_by_block[block_id]
        if cached_tokens != tuple(token_ids):
            return None
        return block_id

    def insert(self, block_hash: int, block_id: int, token_ids: Sequence[int]) -> None:
        if block_hash in self._block_by_hash or block_id in self._entry_by_block:
            return  # first writer wins; an equal prefix computed twice keeps the older block
        self._block_by_hash[block_hash] = block_id
        self._entry_by_block[block_id] = (block_hash, tuple(token_ids))

    def evict(self, block_id: int) -> bool:
        entry = self._entry_by_block.pop(block_id, None)
        if entry is None:
            return False
        del self._block_by_hash[entry[0]]
        return True
