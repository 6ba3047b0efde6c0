"""Outstanding tokens per replica of a model version, in Redis: what the router's load-aware
policies read and what a request's lease holds until it gives it back (prompt first, then the
rest). Leases expire, so a holder that died gives its tokens back by itself."""
from __future__ import annotations

import time
from typing import Callable

from common import redis_keys
from common.pipelines import queue_script, run_script


# KEYS: counts (hash replica -> tokens), lease expiries (zset lease -> ms), lease holdings
# (hash lease -> 'replica:tokens'). ARGV[1]: now_ms. Gives back the tokens of every expired
# lease (its holder died or lost Redis and could not release it).
_RECLAIM = """
local function reclaim(now)
  for _, lease in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
    local held = redis.call('HGET', KEYS[3], lease)
    if held then
      local replica, tokens = string.match(held, '^([^:]*):(-?%d+)$')
      redis.call('HINCRBY', KEYS[1], replica, -tonumber(tokens))
      redis.call('HDEL', KEYS[3], lease)
    end
    redis.call('ZREM', KEYS[2], lease)
  end
end
"""
# For another script that takes a lease itself (the router's decision: inference/router.py).
RECLAIM_LUA = _RECLAIM
# ARGV[2..]: lease, replica, tokens (> 0 holds more; < 0 gives back, never more than held),
# expiry_ms (0: the lease ends). Returns the tokens the lease holds now.
_ADJUST = _RECLAIM + """
reclaim(tonumber(ARGV[1]))
local lease, replica, tokens, expiry = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local held = redis.call('HGET', KEYS[3], lease)
local now_held = 0
if held then now_held = tonumber(string.match(held, ':(-?%d+)$')) end
if tokens < 0 then
  if not held then return 0 end  -- ended or reclaimed: nothing left to give back
  if -tokens > now_held then tokens = -now_held end
end
redis.call('HINCRBY', KEYS[1], replica, tokens)
now_held = now_held + tokens
if expiry == 0 or now_held <= 0 then
  redis.call('HDEL', KEYS[3], lease)
  redis.call('ZREM', KEYS[2], lease)
else
  redis.call('HSET', KEYS[3], lease, replica .. ':' .. now_held)
  redis.call('ZADD', KEYS[2], expiry, lease)
end
return now_held
"""
# ARGV[2]: lease. Ends it wherever it is held (its replica is read from the holdings): for a
# lease whose holder does not know where the router's script placed it.
_END_ANYWHERE = """
local held = redis.call('HGET', KEYS[3], ARGV[2])
if held then
  local replica, tokens = string.match(held, '^([^:]*):(-?%d+)$')
  redis.call('HINCRBY', KEYS[1], replica, -tonumber(tokens))
  redis.call('HDEL', KEYS[3], ARGV[2])
end
redis.call('ZREM', KEYS[2], ARGV[2])
return held and 1 or 0
"""
# ARGV[2..]: replica ids. Reclaims, then returns their counts.
_READ = _RECLAIM + """
reclaim(tonumber(ARGV[1]))
local ids = {}
for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
return redis.call('HMGET', KEYS[1], unpack(ids))
"""


class OutstandingTokens:
    """Per-replica outstanding token counts in a Redis hash per model version, held as leases.

    A request's tokens are a lease (`hold`) that its holder refreshes (`refresh`) while the
    request runs and gives back (`give_back`); a lease not refreshed for `ttl_s` is reclaimed
    by the next `read` or adjustment on its model version, so a dead process's tokens never
    load a replica for good. Invariant: a replica's count is the sum of its live leases (plus
    raw `add`s, which tests use to fake load)."""

    def __init__(self, redis, key_prefix: str, clock: Callable[[], float] = time.time,
                 ttl_s: float = 30.0):
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock
        self._ttl_ms = int(ttl_s * 1000)
        self._adjust = redis.register_script(_ADJUST)
        self._read = redis.register_script(_READ)
        self._end_anywhere = redis.register_script(_END_ANYWHERE)

    def key(self, model_version_id: int) -> str:
        return redis_keys.outstanding_tokens(self._prefix, model_version_id)

    def keys(self, model_version_id: int) -> list[str]:
        base = self.key(model_version_id)
        return [base, f"{base}:leases", f"{base}:held"]

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def read(self, model_version_id: int, replica_ids: list[int]) -> dict[int, int]:
        if not replica_ids:
            return {}
        values = await self._read(keys=self.keys(model_version_id),
                                  args=[self._now_ms(), *[str(i) for i in replica_ids]])
        return self.parse_read(replica_ids, values)

    @property
    def scripts(self) -> tuple:
        """The Lua scripts `queue_read` and `queue_hold` queue (common/pipelines.py)."""
        return self._read, self._adjust

    def queue_read(self, pipe, model_version_id: int, replica_ids: list[int]) -> None:
        """`read` queued on `pipe` (one result: parse it with `parse_read`; `replica_ids`
        must not be empty)."""
        queue_script(pipe, self._read, self.keys(model_version_id),
                     [self._now_ms(), *[str(i) for i in replica_ids]])

    @staticmethod
    def parse_read(replica_ids: list[int], values) -> dict[int, int]:
        return {rid: int(v or 0) for rid, v in zip(replica_ids, values)}

    async def add(self, model_version_id: int, replica_id: int, num_tokens: int) -> None:
        """A raw adjustment outside any lease (never reclaimed)."""
        if num_tokens:
            await self._redis.hincrby(self.key(model_version_id), str(replica_id), num_tokens)

    async def hold(self, model_version_id: int, lease_id: str, replica_id: int,
                   num_tokens: int) -> None:
        now = self._now_ms()
        await self._adjust(keys=self.keys(model_version_id), args=[
            now, lease_id, str(replica_id), num_tokens, now + self._ttl_ms])

    def queue_hold(self, pipe, model_version_id: int, lease_id: str, replica_id: int,
                   num_tokens: int) -> None:
        """`hold` queued on `pipe`."""
        now = self._now_ms()
        queue_script(pipe, self._adjust, self.keys(model_version_id),
                     [now, lease_id, str(replica_id), num_tokens, now + self._ttl_ms])

    async def give_back(self, model_version_id: int, lease_id: str, replica_id: int,
                        num_tokens: int, *, end: bool = False) -> None:
        """Give back `num_tokens` of the lease (never more than it holds); `end`: the lease
        ends (give back all it holds)."""
        now = self._now_ms()
        await run_script(self._adjust, self.keys(model_version_id), [
            now, lease_id, str(replica_id), -abs(num_tokens), 0 if end else now + self._ttl_ms])

    def queue_end(self, batch, model_version_id: int, lease_id: str, replica_id: int,
                  num_tokens: int) -> None:
        """`give_back(..., end=True)` queued on a `common.pipelines.Batch`."""
        batch.script(self._adjust, self.keys(model_version_id),
                     [self._now_ms(), lease_id, str(replica_id), -abs(num_tokens), 0])

    async def end_anywhere(self, model_version_id: int, lease_id: str) -> bool:
        """End the lease on whichever replica holds it (False: it holds nothing, or never
        came to be)."""
        return bool(await run_script(self._end_anywhere, self.keys(model_version_id),
                                     [self._now_ms(), lease_id]))

    def lease_times(self) -> tuple[int, int]:
        """Now and a new lease's expiry (ms), for a script that takes a lease itself (the
        router's decision in Redis, inference/router.py)."""
        now = self._now_ms()
        return now, now + self._ttl_ms

    async def refresh(self, model_version_id: int, lease_id: str) -> bool:
        """Extend the lease; False when it is gone (ended or reclaimed)."""
        return bool(await self._redis.zadd(self.keys(model_version_id)[1],
                                           {lease_id: self._now_ms() + self._ttl_ms},
                                           xx=True, ch=True))
