"""Which replica recently received which prompt blocks: the prefix-affinity index in Redis.

Block hashes are the engine's own (`replica.engine.kv.block_hash.hash_full_blocks`, same block
size, the tenant's cache salt), so a hash here names exactly the KV block the engine caches.
One Redis hash per (model version, block hash): field = replica id, value = when that replica
last received the block (ms, wall clock: compared across processes). Entries older than
`ttl_s` are ignored and keys expire after it, so the index forgets what the replica has
likely evicted; every platform process reads and writes the same keys.

A match and a record are one Lua call each (`_MATCH`, `_RECORD`), whatever the prompt's
length: up to ROUTER_PREFIX_MAX_BLOCKS blocks were that many HMGETs and twice as many
HSET/PEXPIRE commands on the router's pipelines, each packed and parsed by redis-py.
"""
from __future__ import annotations

from typing import Callable, Iterator, Sequence

from common import pipelines
from common.pipelines import queue_script
from inference.policies import BLOCK_SIZE
from replica.engine.kv.block_hash import hash_full_blocks
from common import redis_keys

# A Lua function (also in the router's decision, inference/router.py): KEYS[first..] the
# prompt's block keys, in order; `ids` the replica ids; `oldest` the oldest time (ms) still
# counted. Returns, per replica in `ids`' order, how many leading blocks it holds (a chain:
# block i counts only if blocks 1..i-1 do); stops reading once none does.
MATCH_LUA = """
local function match(first, ids, oldest)
  local n = #ids
  local alive, matched = {}, {}
  for i = 1, n do alive[i] = true; matched[i] = 0 end
  local left = n
  for k = first, #KEYS do
    local row = redis.call('HMGET', KEYS[k], unpack(ids))
    for i = 1, n do
      if alive[i] and ((not row[i]) or tonumber(row[i]) < oldest) then
        alive[i] = false
        left = left - 1
      end
    end
    if left == 0 then break end
    for i = 1, n do if alive[i] then matched[i] = matched[i] + 1 end end
  end
  return matched
end
"""
# KEYS: the prompt's block keys. ARGV[1]: the oldest time (ms) still counted; ARGV[2..]:
# replica ids. Returns `match`'s counts.
_MATCH = MATCH_LUA + """
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
return match(1, ids, tonumber(ARGV[1]))
"""
# KEYS: block keys. ARGV: replica id, now (ms), ttl (ms).
_RECORD = """
for _, key in ipairs(KEYS) do
  redis.call('HSET', key, ARGV[1], ARGV[2])
  redis.call('PEXPIRE', key, ARGV[3])
end
return #KEYS
"""


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
        self._match = redis.register_script(_MATCH)
        self._record = redis.register_script(_RECORD)

    @property
    def scripts(self) -> tuple:
        """The Lua scripts `queue_match` and `queue_record` queue (common/pipelines.py)."""
        return self._match, self._record

    def key(self, model_version_id: int, block_hash: int) -> str:
        return redis_keys.prefix_block(self._prefix, model_version_id, block_hash)

    def script_args(self) -> list[int]:
        """For a script that matches and records as `_MATCH` and `_RECORD` do (the router's
        decision in Redis): now, the oldest entry still counted, the ttl (ms)."""
        now = int(self._clock() * 1000)
        return [now, now - self._ttl_ms, self._ttl_ms]

    async def match(self, model_version_id: int, block_hashes: Sequence[int],
                    replica_ids: Sequence[int]) -> dict[int, int]:
        """Per replica: how many leading blocks of `block_hashes` it holds (a chain: block i
        counts only if blocks 0..i-1 do)."""
        raw, parse = await pipelines.execute(
            self._redis, lambda pipe: self.queue_match(pipe, model_version_id, block_hashes,
                                                       replica_ids), self.scripts)
        return parse(iter(raw))

    def queue_match(self, pipe, model_version_id: int, block_hashes: Sequence[int],
                    replica_ids: Sequence[int]):
        """`match` queued on `pipe` (one EVALSHA; run with `scripts` for NOSCRIPT); returns
        the parser (it consumes its results in order)."""
        reads = bool(block_hashes) and bool(replica_ids)
        if reads:
            oldest = int(self._clock() * 1000) - self._ttl_ms
            queue_script(pipe, self._match,
                         [self.key(model_version_id, h) for h in block_hashes],
                         [oldest, *[str(rid) for rid in replica_ids]])

        def parse(results: Iterator) -> dict[int, int]:
            if not reads:
                return {rid: 0 for rid in replica_ids}
            return {rid: int(n) for rid, n in zip(replica_ids, next(results))}
        return parse

    async def record(self, model_version_id: int, block_hashes: Sequence[int],
                     replica_id: int) -> None:
        """`replica_id` now holds these blocks (it is about to prefill them)."""
        await pipelines.execute(
            self._redis, lambda pipe: self.queue_record(pipe, model_version_id, block_hashes,
                                                        replica_id), self.scripts)

    def queue_record(self, pipe, model_version_id: int, block_hashes: Sequence[int],
                     replica_id: int) -> None:
        """`record` queued on `pipe` (one EVALSHA; run with `scripts` for NOSCRIPT)."""
        if block_hashes:
            queue_script(pipe, self._record,
                         [self.key(model_version_id, h) for h in block_hashes],
                         [str(replica_id), int(self._clock() * 1000), self._ttl_ms])

    async def forget(self, model_version_id: int, block_hashes: Sequence[int],
                     replica_id: int) -> None:
        """The replica failed before computing these blocks: do not send their prefix there."""
        if not block_hashes:
            return
        pipe = self._redis.pipeline(transaction=False)
        for block_hash in block_hashes:
            pipe.hdel(self.key(model_version_id, block_hash), str(replica_id))
        await pipe.execute()
