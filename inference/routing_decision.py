"""`balanced` decided in Redis, atomically with its lease (inference/router.py calls it).

A snapshot read on the admission's round trip is one round trip stale for the other API
processes' leases: a process that sees part of another's decisions makes up for them while
the other goes on without seeing its own (twelve new prefixes at once could land 5 / 4 / 3 on
three replicas; tests/platform/test_router.py). Here one Lua script reads every candidate's
live outstanding tokens and prefix match (every process's leases and records that landed
before it, this process's earlier ones included: one connection, in order), computes the
policy's score (`policies.Balanced.score`: both must agree, a test checks them on random
state), then takes the lease, records the prefix and counts the request for the chosen
replica. Redis orders every process's decisions.
"""
from __future__ import annotations

import asyncio
import logging

from common import pipelines
from common.random_ids import random_hex
from inference.outstanding_tokens import RECLAIM_LUA, OutstandingTokens
from inference.policies import BLOCK_SIZE, Candidate, RouteRequest
from inference.prefix_index import MATCH_LUA, PrefixIndex
from inference.routing_stats import RoutingStats

logger = logging.getLogger(__name__)

# KEYS: 1-3 the outstanding tokens (OutstandingTokens.keys), 4 the routing counters, 5 the
# counters' model set, 6.. the prompt's block keys (PrefixIndex.key), in order.
# ARGV: 1 now (ms), 2 the lease's expiry (ms), 3 the lease, 4 the index's now (ms), 5 the
# oldest index entry counted (ms), 6 the index's ttl (ms), 7 the model version, 8 the policy,
# 9 prompt tokens, 10 max tokens, 11 blocks needed, 12 block size, 13 kv weight, 14 evict
# weight, then per candidate, in the policy's tie order: replica, free KV blocks, free
# uncached KV blocks (-1: unknown). Returns {replica, tokens held}.
_DECIDE = RECLAIM_LUA + MATCH_LUA + """
reclaim(tonumber(ARGV[1]))
local ids, free, uncached = {}, {}, {}
for b = 15, #ARGV, 3 do
  ids[#ids + 1] = ARGV[b]
  free[#ids] = tonumber(ARGV[b + 1])
  uncached[#ids] = tonumber(ARGV[b + 2])
end
local n = #ids
local matched = match(6, ids, tonumber(ARGV[5]))
local loads = redis.call('HMGET', KEYS[1], unpack(ids))
local prompt, max_tokens = tonumber(ARGV[9]), tonumber(ARGV[10])
local needed_all, bs = tonumber(ARGV[11]), tonumber(ARGV[12])
local kv_weight, evict_weight = tonumber(ARGV[13]), tonumber(ARGV[14])
local best, best_score, best_miss = 0, 0, 0
for i = 1, n do
  local miss = prompt - math.max(0, math.min(matched[i] * bs, prompt - 1))
  local score = (tonumber(loads[i]) or 0) + miss
  if free[i] >= 0 then
    local needed = needed_all - matched[i]
    score = score + kv_weight * math.max(0, needed - free[i]) * bs
    if uncached[i] >= 0 then
      score = score + evict_weight * math.max(0, math.min(needed, free[i]) - uncached[i]) * bs
    end
  end
  if best == 0 or score < best_score then best, best_score, best_miss = i, score, miss end
end
local replica, lease = ids[best], ARGV[3]
local tokens = best_miss + max_tokens
redis.call('HINCRBY', KEYS[1], replica, tokens)
redis.call('HSET', KEYS[3], lease, replica .. ':' .. tokens)
redis.call('ZADD', KEYS[2], tonumber(ARGV[2]), lease)
for k = 6, #KEYS do
  redis.call('HSET', KEYS[k], replica, ARGV[4])
  redis.call('PEXPIRE', KEYS[k], ARGV[6])
end
redis.call('SADD', KEYS[5], ARGV[7])
redis.call('HINCRBY', KEYS[4], 'routed|' .. replica .. '|' .. ARGV[8], 1)
return {tonumber(replica), tokens}
"""


class RedisDecision:
    """Takes a lease on the replica the policy's score picks, in one round trip."""

    def __init__(self, redis, counter: OutstandingTokens, prefix_index: PrefixIndex,
                 stats: RoutingStats):
        self._redis = redis
        self._counter = counter
        self._index = prefix_index
        self._stats = stats
        self._script = redis.register_script(_DECIDE)

    async def take(self, model_version_id: int, policy, request: RouteRequest,
                   candidates: list[Candidate]) -> tuple[int, str, int]:
        """(replica id, lease id, tokens held) of the lease taken; `candidates` in the policy's
        tie order (their loads and prefix blocks are read in Redis, not taken from them);
        `policy` has `name`, `kv_weight` and `evict_weight` (policies.Balanced). A decision
        whose reply is lost (a cancellation while it was on its way, a Redis error) ends its
        lease by id wherever it landed (queued after it, on the same connection), else the
        lease expires."""
        lease_id = random_hex()
        index = self._index
        keys = [*self._counter.keys(model_version_id),
                self._stats.key(model_version_id), self._stats.models_key(),
                *[index.key(model_version_id, h) for h in request.block_hashes]]
        now, expiry = self._counter.lease_times()
        args = [now, expiry, lease_id, *index.script_args(), model_version_id, policy.name,
                request.num_prompt_tokens, request.max_tokens, request.num_blocks_needed,
                BLOCK_SIZE, policy.kv_weight, policy.evict_weight]
        for c in candidates:
            free, uncached = c.kv_free_blocks, c.kv_free_uncached_blocks
            args += [c.replica.replica_id, -1 if free is None else free,
                     -1 if free is None or uncached is None else uncached]
        try:
            raw, _ = await pipelines.execute(
                self._redis, lambda pipe: pipelines.queue_script(pipe, self._script, keys, args),
                (self._script,))
        except BaseException:
            await asyncio.shield(self._end_quietly(model_version_id, lease_id))
            raise
        replica_id, held = (int(v) for v in raw[0])
        return replica_id, lease_id, held

    async def _end_quietly(self, model_version_id: int, lease_id: str) -> None:
        try:
            await self._counter.end_anywhere(model_version_id, lease_id)
        except Exception:  # noqa: BLE001 - the lease expires instead
            logger.warning("lease %s not ended; it expires", lease_id)
