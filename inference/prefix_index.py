"""Which replica recently received which prompt blocks: the prefix-affinity index in Redis.

Block hashes are the engine's own (`replica.engine.kv.block_hash.hash_full_blocks`, same block
size, the tenant's cache salt), so a hash here names exactly the KV block the engine caches.
One Redis hash per (model version, block hash): field = replica id, value = when that replica
last received the block (ms, wall clock: compared across processes). Entries older than
`ttl_s` are ignored and keys expire after it, so the index forgets what the replica has
likely evicted; every platform process reads and writes the same keys.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

from inference.policies import BLOCK_SIZE
from replica.engine.kv.block_hash import hash_full_blocks
from common import redis_keys


def prompt_block_hashes(token_ids: Sequence[int], cache_salt: str, max_blocks: int) -> tuple[int, ...]:
    """The chained hashes of the prompt's leading full blocks, as the engine computes them."""
    leading = token_ids[: max_blocks * BLOCK_SIZE]
    return tuple(hash_full_blocks(leading, BLOCK_SIZE, cache_salt))


class PrefixIndex:
    def __init__(self, redis, key_prefix: str, clock: Callable[[], float], ttl_s: float):
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock  # wall-clock seconds
        self._ttl_ms = int(ttl_s * 1000)

    def key(self, model_version_id: int, block_hash: int) -> str:
        return redis_keys.prefix_block(self._prefix, model_version_id, block_hash)

    async def match(self, model_version_id: int, block_hashes: Sequence[int],
                    replica_ids: Sequence[int]) -> dict[int, int]:
        """Per replica: how many leading blocks of `block_hashes` it holds (a chain: block i
        counts only if blocks 0..i-1 do)."""
        pipe = self._redis.pipeline(transaction=False)
        parse = self.queue_match(pipe, model_version_id, block_hashes, replica_ids)
        return parse(iter(await pipe.execute()))

    def queue_match(self, pipe, model_version_id: int, block_hashes: Sequence[int],
                    replica_ids: Sequence[int]):
        """`match` queued on `pipe`; returns the parser (it consumes its results in order)."""
        reads = bool(block_hashes) and bool(replica_ids)
        fields = [str(rid) for rid in replica_ids]
        if reads:
            for block_hash in block_hashes:
                pipe.hmget(self.key(model_version_id, block_hash), fields)

        def parse(results: Iterator) -> dict[int, int]:
            matched = {rid: 0 for rid in replica_ids}
            if not reads:
                return matched
            rows = [next(results) for _ in block_hashes]
            oldest = int(self._clock() * 1000) - self._ttl_ms
            alive = set(replica_ids)
            for row in rows:
                for rid, seen in zip(replica_ids, row):
                    if rid in alive and (seen is None or int(seen) < oldest):
                        alive.discard(rid)
                if not alive:
                    break
                for rid in alive:
                    matched[rid] += 1
            return matched
        return parse

    async def record(self, model_version_id: int, block_hashes: Sequence[int],
                     replica_id: int) -> None:
        """`replica_id` now holds these blocks (it is about to prefill them)."""
        pipe = self._redis.pipeline(transaction=False)
        self.queue_record(pipe, model_version_id, block_hashes, replica_id)
        await pipe.execute()

    def queue_record(self, pipe, model_version_id: int, block_hashes: Sequence[int],
                     replica_id: int) -> None:
        """`record` queued on `pipe`."""
        now_ms = int(self._clock() * 1000)
        for block_hash in block_hashes:
            key = self.key(model_version_id, block_hash)
            pipe.hset(key, str(replica_id), now_ms)
            pipe.pexpire(key, self._ttl_ms)

    async def forget(self, model_version_id: int, block_hashes: Sequence[int],
                     replica_id: int) -> None:
        """The replica failed before computing these blocks: do not send their prefix there."""
        if not block_hashes:
            return
        pipe = self._redis.pipeline(transaction=False)
        for block_hash in block_hashes:
            pipe.hdel(self.key(model_version_id, block_hash), str(replica_id))
        await pipe.execute()
