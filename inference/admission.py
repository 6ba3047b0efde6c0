"""The admission queue: per model version, bounded, shared by every platform process in Redis.

A request takes one of the model version's slots (ready replicas x slots per replica) before
it is routed. When none is free it waits in the queue; whenever a slot frees (or a waiter
polls) the Lua `pump` hands free slots to the best waiters: highest tier (lowest priority
value) first, then the policy's order within the tier. `FairShare` serves the tenant with the
least virtual tokens served (weighted prompt + max_tokens); a tenant that returns after idling
is caught up to the virtual clock so idle time banks no credit. `Fifo` is arrival order (the
"fairness off" baseline of benchmarks/fairness.py). Beyond the capacity, `headroom` slots go
only to tenants with nothing running: a tenant arriving behind another's burst starts at once
instead of waiting for one of the burst's requests to finish (the engine then shares its steps
fairly); the total in flight stays bounded by capacity + headroom.

Invariants: work-conserving (a slot is never idle while a live waiter exists: every enter,
poll and release pumps); at most `max_queue` waiters; a waiter that stops polling (process
died) is dropped after `heartbeat_ms`, a slot held by a dead process expires after `slot_ttl_ms`.
"""
from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass
from typing import Awaitable, Callable

# Wait-time histogram bounds (ms); the last bucket is +Inf.
WAIT_BUCKETS_MS = (10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)

_COMMON = """
local K_WAIT, K_RUN, K_VT, K_HIST = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local BUCKETS = {%(buckets)s}
local function purge(now)
  redis.call('ZREMRANGEBYSCORE', K_RUN, '-inf', now)
  local all = redis.call('HGETALL', K_WAIT)
  for i = 1, #all, 2 do
    local w = cjson.decode(all[i + 1])
    if w.hb < now then
      redis.call('HDEL', K_WAIT, all[i])
      redis.call('HINCRBY', K_HIST, 'expired', 1)
    end
  end
end
local function record_wait(ms)
  local idx = #BUCKETS + 1
  for i = 1, #BUCKETS do if ms <= BUCKETS[i] then idx = i break end end
  redis.call('HINCRBY', K_HIST, 'b' .. idx, 1)
  redis.call('HINCRBYFLOAT', K_HIST, 'sum_ms', ms)
  redis.call('HINCRBY', K_HIST, 'count', 1)
end
local function vt(tenant) return tonumber(redis.call('HGET', K_VT, tenant) or '0') end
%(pick)s
local function running_tenants()
  local busy = {}
  for _, ticket in ipairs(redis.call('ZRANGE', K_RUN, 0, -1)) do
    busy[string.match(ticket, '^([^:]*):')] = true
  end
  return busy
end
-- Hands out slots: `capacity` to the best waiters, then up to `headroom` more, only to waiters
-- whose tenant has nothing running (so a tenant arriving behind another's burst starts now).
local function pump(now, capacity, headroom, slot_ttl)
  purge(now)  -- a dead waiter must never be handed a slot
  while true do
    local num_running = redis.call('ZCARD', K_RUN)
    if num_running >= capacity + headroom then return end
    local all = redis.call('HGETALL', K_WAIT)
    if #all == 0 then return end
    local busy = nil
    if num_running >= capacity then busy = running_tenants() end
    local best, best_key, best_w = nil, nil, nil
    for i = 1, #all, 2 do
      local w = cjson.decode(all[i + 1])
      local key = sort_key(w)
      local better = best == nil
      if busy ~= nil and busy[w.tenant] then better = false key = nil end
      if not better and key ~= nil then
        for j = 1, #key do
          if key[j] ~= best_key[j] then better = key[j] < best_key[j] break end
        end
      end
      if better then best, best_key, best_w = all[i], key, w end
    end
    if best == nil then return end
    redis.call('HDEL', K_WAIT, best)
    redis.call('ZADD', K_RUN, now + slot_ttl, best)
    local served = vt(best_w.tenant)
    local clock = tonumber(redis.call('HGET', K_VT, '__clock') or '0')
    if served > clock then redis.call('HSET', K_VT, '__clock', served) end
    redis.call('HSET', K_VT, best_w.tenant, served + best_w.cost)
    record_wait(now - best_w.at)
  end
end
"""

_FAIR_PICK = """
local function sort_key(w) return {w.priority, vt(w.tenant), w.seq} end
"""
_FIFO_PICK = """
local function sort_key(w) return {w.priority, w.seq} end
"""

# ARGV: now, ticket, priority, tenant, cost, capacity, max_queue, heartbeat_ms, slot_ttl_ms,
# headroom. Returns 1 admitted, 0 queued, -1 queue full.
_ENTER = """
local now, ticket = tonumber(ARGV[1]), ARGV[2]
local capacity, max_queue = tonumber(ARGV[6]), tonumber(ARGV[7])
local hb_ms, slot_ttl, headroom = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
purge(now)
if redis.call('HLEN', K_WAIT) >= max_queue and redis.call('ZCARD', K_RUN) >= capacity then
  redis.call('HINCRBY', K_HIST, 'rejected_full', 1)
  return -1
end
local tenant = ARGV[4]
local backlogged = false
for _, raw in ipairs(redis.call('HVALS', K_WAIT)) do
  if cjson.decode(raw).tenant == tenant then backlogged = true break end
end
if not backlogged then  -- returning tenant: no credit for the time it was idle
  local clock = tonumber(redis.call('HGET', K_VT, '__clock') or '0')
  if vt(tenant) < clock then redis.call('HSET', K_VT, tenant, clock) end
end
local seq = redis.call('HINCRBY', K_HIST, 'seq', 1)
redis.call('HSET', K_WAIT, ticket, cjson.encode({priority = tonumber(ARGV[3]), tenant = tenant,
  cost = tonumber(ARGV[5]), seq = seq, at = now, hb = now + hb_ms}))
pump(now, capacity, headroom, slot_ttl)
if redis.call('ZSCORE', K_RUN, ticket) then return 1 end
return 0
"""

# ARGV: now, ticket, capacity, heartbeat_ms, slot_ttl_ms, headroom. Returns 1 admitted, 0 waiting,
# -2 unknown (expired).
_POLL = """
local now, ticket, capacity = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local hb_ms, slot_ttl, headroom = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
if redis.call('ZSCORE', K_RUN, ticket) then return 1 end
local raw = redis.call('HGET', K_WAIT, ticket)
if not raw then return -2 end
local w = cjson.decode(raw)
w.hb = now + hb_ms
redis.call('HSET', K_WAIT, ticket, cjson.encode(w))
-- Releases pump, so a poll only has to when slots are free (a slot expired, capacity grew):
-- the common poll is O(1), not a scan of the queue.
if redis.call('ZCARD', K_RUN) < capacity + headroom then
  pump(now, capacity, headroom, slot_ttl)
  if redis.call('ZSCORE', K_RUN, ticket) then return 1 end
end
return 0
"""

# ARGV: now, ticket, capacity, slot_ttl_ms, reason ('' = release), headroom. Leaves the queue
# or frees the slot, then hands free slots to waiters.
_LEAVE = """
local now, ticket, capacity, slot_ttl = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local headroom = tonumber(ARGV[6])
redis.call('HDEL', K_WAIT, ticket)
redis.call('ZREM', K_RUN, ticket)
if ARGV[5] ~= '' then redis.call('HINCRBY', K_HIST, 'rejected_' .. ARGV[5], 1) end
pump(now, capacity, headroom, slot_ttl)
return 1
"""


def queue_keys(key_prefix: str, model_version_id: int) -> list[str]:
    """waiting (hash), running (sorted set), virtual time (hash), stats (hash: `seq` counts
    every request that entered, `rejected_full` those refused at the door)."""
    base = f"{key_prefix}admission:{model_version_id}"
    return [f"{base}:waiting", f"{base}:running", f"{base}:vtime", f"{base}:stats"]


class QueueFull(Exception):
    pass


class QueueTimeout(Exception):
    pass


@dataclass(frozen=True)
class Waiter:
    tenant: str
    priority: int  # lower first
    cost_tokens: int  # what the fair-share counter is charged when admitted
    max_wait_s: float


class AdmissionPolicy:
    """A waiting-order policy: the Lua `sort_key(w)` it compiles into the scripts."""

    name: str
    pick_lua: str


class FairShare(AdmissionPolicy):
    name = "fair_share"
    pick_lua = _FAIR_PICK


class Fifo(AdmissionPolicy):
    name = "fifo"
    pick_lua = _FIFO_PICK


ADMISSION_POLICIES: dict[str, type[AdmissionPolicy]] = {p.name: p for p in (FairShare, Fifo)}


@dataclass
class Slot:
    queue: "AdmissionQueue"
    model_version_id: int
    ticket: str
    capacity: int
    headroom: int
    waited_s: float

    async def release(self) -> None:
        await self.queue.leave(self.model_version_id, self.ticket, self.capacity, self.headroom)


class AdmissionQueue:
    """`redis`: asyncio client; `clock`: wall-clock seconds (compared across processes);
    `sleep`: injected for tests."""

    def __init__(self, redis, key_prefix: str, clock: Callable[[], float],
                 policy: AdmissionPolicy, max_queue: int, heartbeat_s: float = 5.0,
                 slot_ttl_s: float = 900.0, poll_s: float = 0.02, sleep=asyncio.sleep):
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock
        self._max_queue = max_queue
        self._heartbeat_ms = int(heartbeat_s * 1000)
        self._slot_ttl_ms = int(slot_ttl_s * 1000)
        self._poll_s = poll_s
        self._sleep = sleep
        common = _COMMON % {"buckets": ", ".join(map(str, WAIT_BUCKETS_MS)),
                            "pick": policy.pick_lua}
        self._enter = redis.register_script(common + _ENTER)
        self._poll = redis.register_script(common + _POLL)
        self._leave = redis.register_script(common + _LEAVE)

    def keys(self, model_version_id: int) -> list[str]:
        return queue_keys(self._prefix, model_version_id)

    def models_key(self) -> str:
        return f"{self._prefix}admission:models"

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    async def admit(self, model_version_id: int, waiter: Waiter, capacity: int,
                    headroom: int = 0,
                    refresh: Callable[[], Awaitable[tuple[int, int]]] | None = None) -> Slot:
        """A slot, at once or after waiting; QueueFull / QueueTimeout otherwise. Cancelling
        the caller while it waits leaves the queue. `headroom`: slots beyond `capacity` only
        for tenants with nothing running. `refresh`: re-reads (capacity, headroom) before each
        poll, for a version whose capacity is growing (its first replica is loading)."""
        ticket = f"{waiter.tenant}:{uuid.uuid4().hex}"  # the pump reads the tenant from it
        keys = self.keys(model_version_id)
        started = self._clock()
        await self._redis.sadd(self.models_key(), str(model_version_id))
        state = int(await self._enter(keys=keys, args=[
            self._now_ms(), ticket, waiter.priority, waiter.tenant, waiter.cost_tokens,
            capacity, self._max_queue, self._heartbeat_ms, self._slot_ttl_ms, headroom]))
        if state == -1:
            raise QueueFull()
        try:
            while state != 1:
                if self._clock() - started >= waiter.max_wait_s:
                    await self.leave(model_version_id, ticket, capacity, headroom, "timeout")
                    raise QueueTimeout()
                await self._sleep(self._poll_s)
                if refresh is not None:
                    capacity, headroom = await refresh()
                state = int(await self._poll(keys=keys, args=[
                    self._now_ms(), ticket, capacity, self._heartbeat_ms, self._slot_ttl_ms,
                    headroom]))
                if state == -2:
                    raise QueueTimeout()
        except asyncio.CancelledError:
            await asyncio.shield(self.leave(model_version_id, ticket, capacity, headroom))
            raise
        return Slot(self, model_version_id, ticket, capacity, headroom, self._clock() - started)

    async def leave(self, model_version_id: int, ticket: str, capacity: int, headroom: int = 0,
                    reason: str = "") -> None:
        await self._leave(keys=self.keys(model_version_id), args=[
            self._now_ms(), ticket, capacity, self._slot_ttl_ms, reason, headroom])
