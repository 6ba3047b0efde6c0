"""The admission queue: per model, bounded, shared by every platform process in Redis.

A request takes one of its model version's slots (ready replicas x slots per replica) before it
is routed. All versions of a model (a canary split, say) share one queue: one bound, one
fair-share clock. When its version has no free slot a request waits; whenever a slot frees, the
Lua `pump` hands free slots to the best waiters that can use them: highest tier (lowest
priority value) first, then the policy's order within the tier, skipping only waiters whose
version is still full (a slot freed on one version goes to the best waiter for that version).
`FairShare` serves the tenant with the least virtual tokens served (weighted prompt +
max_tokens); a tenant that returns after idling is caught up to the virtual clock so idle time
banks no credit. `Fifo` is arrival order (the "fairness off" baseline of
benchmarks/fairness.py). Beyond a version's capacity, `headroom` slots go only to tenants
running fewer of the version's requests than their fair share of its capacity (capacity / the
tenants running or waiting on it; nothing running always qualifies): a tenant arriving behind
another's burst starts at once instead of waiting for one of the burst's requests to finish;
in flight stays bounded by capacity + headroom.

Waiting is by notification, not polling: the pump publishes the admitted waiter's ticket and
the waiter's process, which listens on one pub/sub connection (inference/admission_wakeups.py),
wakes it. A request admitted on entry (the common case) costs one round trip and never
subscribes; one that has to wait subscribes, then polls once (a wake-up published between its
entry and its subscription is seen by that poll). A wake-up can be lost (a dropped
connection); the waiter then polls after `fallback_poll_s`, which also refreshes its
heartbeat.

A slot is a lease: it expires `slot_ttl_s` after it was taken or last refreshed (`Slot.refresh`,
called by its holder while the request runs), and the scripts reclaim expired slots before
handing any out, so a slot of a process that died (or lost Redis) comes back by itself.

Invariants: work-conserving (a slot is never idle while a live waiter for its version exists:
every enter, release and fallback poll with free slots pumps when anyone waits; an entry that
finds nobody waiting and fewer slots running than its version's capacity takes one directly,
as the pump would, without scanning every ticket); at most `max_queue` waiters per
model; a waiter that stops polling (process died) is dropped after `heartbeat_s`, a slot held by
a dead process expires after `slot_ttl_s`. Tickets are `tenant:version:uuid` (the pump reads
tenant and version from them), so tenant names must not contain ':'.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable
from common import redis_keys

from redis.exceptions import NoScriptError

from common.pipelines import queue_script
from common.random_ids import random_hex
from inference.admission_wakeups import WakeUps

logger = logging.getLogger(__name__)

# Wait-time histogram bounds (ms); the last bucket is +Inf.
WAIT_BUCKETS_MS = (10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)

# KEYS: waiting (hash ticket -> waiter JSON), running (zset ticket -> expiry ms), vtime (hash
# tenant -> virtual tokens served, '__clock'), stats (hash), capacity (hash version ->
# 'capacity:headroom', as last reported by a caller). ARGV[1..3] of every script: now_ms,
# slot_ttl_ms, the wake-up channel (the pump publishes each admitted ticket there).
# A script is _HEAD, then _COMMON's functions, then its own body; the entry's common case runs
# between the two (`_ENTER_DIRECT`), before the functions are made: making them (closures)
# cost about 2 us of Redis per call, an eighth of that entry.
_HEAD = """
local K_WAIT, K_RUN, K_VT, K_HIST, K_CAP = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local NOW, SLOT_TTL, WAKE = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
"""
_COMMON = """
local BUCKETS = {%(buckets)s}
local function purge()
  redis.call('ZREMRANGEBYSCORE', K_RUN, '-inf', NOW)
  local all = redis.call('HGETALL', K_WAIT)
  for i = 1, #all, 2 do
    if cjson.decode(all[i + 1]).hb < NOW then
      redis.call('HDEL', K_WAIT, all[i])
      redis.call('HINCRBY', K_HIST, 'expired', 1)
    end
  end
end
local function record_wait(ms)
  local idx = #BUCKETS + 1
  for i = 1, #BUCKETS do if ms <= BUCKETS[i] then idx = i break end end
  redis.call('HINCRBY', K_HIST, 'b' .. idx, 1)
  if ms ~= 0 then redis.call('HINCRBYFLOAT', K_HIST, 'sum_ms', ms) end
  redis.call('HINCRBY', K_HIST, 'count', 1)
end
local function vt(tenant) return tonumber(redis.call('HGET', K_VT, tenant) or '0') end
-- A tenant coming back from idle starts at the virtual clock: idle time banks no credit.
local function catch_up(tenant)
  local clock = tonumber(redis.call('HGET', K_VT, '__clock') or '0')
  if vt(tenant) < clock then redis.call('HSET', K_VT, tenant, clock) end
end
-- The admitted ticket takes its slot: the tenant is charged `cost` virtual tokens, the clock
-- moves to what it had been served, the wait goes into the histogram.
local function take_slot(ticket, tenant, cost, waited_ms)
  redis.call('ZADD', K_RUN, NOW + SLOT_TTL, ticket)
  local served = vt(tenant)
  local clock = tonumber(redis.call('HGET', K_VT, '__clock') or '0')
  if served > clock then redis.call('HSET', K_VT, '__clock', served) end
  redis.call('HSET', K_VT, tenant, served + cost)
  record_wait(waited_ms)
end
%(pick)s
local function capacities()
  local caps, total = {}, 0
  local raw = redis.call('HGETALL', K_CAP)
  for i = 1, #raw, 2 do
    local c, h = string.match(raw[i + 1], '^(%%d+):(%%d+)$')
    caps[raw[i]] = {tonumber(c), tonumber(h)}
    total = total + tonumber(c) + tonumber(h)
  end
  return caps, total
end
-- Hands out free slots, best eligible waiter first. A waiter is eligible when its version has
-- a free slot within capacity, or one of the headroom slots and its tenant runs fewer of the
-- version's requests than its fair share of the capacity (capacity / tenants running or
-- waiting on the version; a tenant with nothing running always qualifies).
local function pump()
  purge()  -- a dead waiter must never be handed a slot
  local caps = capacities()
  local running, mine, active, num_active = {}, {}, {}, {}
  local function mark(tenant, version)
    local key = tenant .. ':' .. version
    if not active[key] then
      active[key] = true
      num_active[version] = (num_active[version] or 0) + 1
    end
  end
  for _, ticket in ipairs(redis.call('ZRANGE', K_RUN, 0, -1)) do
    local tenant, version = string.match(ticket, '^([^:]*):([^:]*):')
    running[version] = (running[version] or 0) + 1
    mine[tenant .. ':' .. version] = (mine[tenant .. ':' .. version] or 0) + 1
    mark(tenant, version)
  end
  local waiters = {}
  local all = redis.call('HGETALL', K_WAIT)
  for i = 1, #all, 2 do
    local w = cjson.decode(all[i + 1])
    waiters[#waiters + 1] = {all[i], w}
    mark(w.tenant, w.v)
  end
  local function under_share(w, cap)
    return (mine[w.tenant .. ':' .. w.v] or 0) * num_active[w.v] < cap[1]
  end
  while true do
    local best_i, best_key = nil, nil
    for i, entry in ipairs(waiters) do
      local w = entry and entry[2]
      local cap = w and caps[w.v]
      if cap then
        local n = running[w.v] or 0
        if n < cap[1] or (n < cap[1] + cap[2] and under_share(w, cap)) then
          local key = sort_key(w)
          local better = best_i == nil
          if not better then
            for j = 1, #key do
              if key[j] ~= best_key[j] then better = key[j] < best_key[j] break end
            end
          end
          if better then best_i, best_key = i, key end
        end
      end
    end
    if best_i == nil then return end
    local ticket, w = waiters[best_i][1], waiters[best_i][2]
    waiters[best_i] = false
    redis.call('HDEL', K_WAIT, ticket)
    take_slot(ticket, w.tenant, w.cost, NOW - w.at)
    running[w.v] = (running[w.v] or 0) + 1
    mine[w.tenant .. ':' .. w.v] = (mine[w.tenant .. ':' .. w.v] or 0) + 1
    redis.call('PUBLISH', WAKE, ticket)
  end
end
"""

_FAIR_PICK = """
local function sort_key(w) return {w.priority, vt(w.tenant), w.seq} end
"""
_FIFO_PICK = """
local function sort_key(w) return {w.priority, w.seq} end
"""

# ARGV[4..]: ticket, priority, tenant, cost, version, capacity, headroom, max_queue,
# heartbeat_ms, model; KEYS[6]: the set of models with a queue (the model is added to it).
# Returns 1 admitted, 0 queued, -1 queue full.
_ENTER_DIRECT = """
local ticket, tenant, version = ARGV[4], ARGV[6], ARGV[8]
local max_queue, hb_ms = tonumber(ARGV[11]), tonumber(ARGV[12])
redis.call('SADD', KEYS[6], ARGV[13])
redis.call('HSET', K_CAP, version, ARGV[9] .. ':' .. ARGV[10])
local seq = redis.call('HINCRBY', K_HIST, 'seq', 1)
redis.call('HINCRBY', K_HIST, 'seq:' .. version, 1)
redis.call('ZREMRANGEBYSCORE', K_RUN, '-inf', NOW)
if redis.call('HLEN', K_WAIT) == 0 and redis.call('ZCARD', K_RUN) < tonumber(ARGV[9]) then
  -- Nobody waits and the model's running slots (every version's) are fewer than this
  -- version's capacity: the pump would admit this request alone, at once. It takes its slot
  -- without the pump's scan of every running and waiting ticket (the common case; 77 us of
  -- Redis per entry with 32 running, round frontdoor14): catch_up then take_slot with a wait
  -- of 0 ms, in one read and one write of the virtual times.
  local vts = redis.call('HMGET', K_VT, tenant, '__clock')
  local served, clock = tonumber(vts[1] or '0'), tonumber(vts[2] or '0')
  redis.call('ZADD', K_RUN, NOW + SLOT_TTL, ticket)
  if served <= clock then
    redis.call('HSET', K_VT, tenant, clock + tonumber(ARGV[7]))
  else
    redis.call('HSET', K_VT, tenant, served + tonumber(ARGV[7]), '__clock', served)
  end
  redis.call('HINCRBY', K_HIST, 'b%(zero_wait_bucket)d', 1)
  redis.call('HINCRBY', K_HIST, 'count', 1)
  return 1
end
"""
_ENTER = """
purge()
local backlogged = false
for _, raw in ipairs(redis.call('HVALS', K_WAIT)) do
  if cjson.decode(raw).tenant == tenant then backlogged = true break end
end
if not backlogged then catch_up(tenant) end
redis.call('HSET', K_WAIT, ticket, cjson.encode({priority = tonumber(ARGV[5]), tenant = tenant,
  cost = tonumber(ARGV[7]), v = version, seq = seq, at = NOW, hb = NOW + hb_ms}))
pump()
if redis.call('ZSCORE', K_RUN, ticket) then
  return 1
end
if redis.call('HLEN', K_WAIT) > max_queue then  -- it would have to wait, and there is no room
  redis.call('HDEL', K_WAIT, ticket)
  redis.call('HINCRBY', K_HIST, 'rejected_full', 1)
  redis.call('HINCRBY', K_HIST, 'rejected_full:' .. version, 1)
  return -1
end
return 0
"""

# ARGV[4..]: ticket, version, capacity, headroom, heartbeat_ms. Returns 1 admitted, 0 waiting,
# -2 unknown (expired). The fallback for lost wake-ups; also the waiter's heartbeat.
_POLL = """
local ticket, version, hb_ms = ARGV[4], ARGV[5], tonumber(ARGV[8])
redis.call('HSET', K_CAP, version, ARGV[6] .. ':' .. ARGV[7])
if redis.call('ZSCORE', K_RUN, ticket) then
  return 1
end
local raw = redis.call('HGET', K_WAIT, ticket)
if not raw then return -2 end
local w = cjson.decode(raw)
w.hb = NOW + hb_ms
redis.call('HSET', K_WAIT, ticket, cjson.encode(w))
-- Releases pump, so a poll only has to when slots are free (a slot's lease expired, capacity
-- grew); purge first: an expired slot still counts in the running set until reclaimed.
purge()
local _, total = capacities()
if redis.call('ZCARD', K_RUN) < total then
  pump()
  if redis.call('ZSCORE', K_RUN, ticket) then
    return 1
  end
end
return 0
"""

# ARGV[4..]: ticket, reason ('' = release). Leaves the queue or frees the slot, then hands
# free slots to waiters.
_LEAVE = """
local ticket = ARGV[4]
redis.call('HDEL', K_WAIT, ticket)
redis.call('ZREM', K_RUN, ticket)
if ARGV[5] ~= '' then redis.call('HINCRBY', K_HIST, 'rejected_' .. ARGV[5], 1) end
if redis.call('HLEN', K_WAIT) > 0 then  -- nobody waiting: no slot to hand out (an expired
  pump()                                 -- slot is purged by the next entry or poll)
end
return 1
"""


def queue_keys(key_prefix: str, model: str) -> list[str]:
    """waiting (hash), running (sorted set), virtual time (hash), stats (hash: `seq` counts
    every request that entered, `rejected_full` those refused at the door, and the same per
    version as `seq:<version id>` / `rejected_full:<version id>`), capacity (hash)."""
    return redis_keys.admission(key_prefix, model).as_list()


class QueueFull(Exception):
    pass


class QueueTimeout(Exception):
    pass


@dataclass(frozen=True)
class Waiter:
    tenant: str  # no ':'
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
    model: str
    model_version_id: int
    ticket: str
    waited_s: float
    queued: bool = False  # it waited in the queue (not admitted on entry)

    async def release(self) -> None:
        await self.queue.leave(self.model, self.ticket)

    def queue_release(self, batch):
        """`release` queued on a `common.pipelines.Batch` (the request's end); on failure
        the slot's lease expires."""
        batch.script(self.queue._leave, self.queue.keys(self.model),
                     [*self.queue._common_args(self.model), self.ticket, ""])

        async def finish(results: list) -> None:
            if isinstance(results[0], BaseException):
                logger.warning("admission slot %s not released (%r); it expires", self.ticket,
                               results[0])
        return finish

    async def refresh(self) -> bool:
        """Extend the lease by the queue's slot TTL; False if it had expired (reclaimed)."""
        return await self.queue.refresh(self.model, self.ticket)


class AdmissionQueue:
    """`redis`: asyncio client; `clock`: wall-clock seconds (compared across processes).
    `fallback_poll_s`: how long a waiter waits for its wake-up before it polls (must stay
    below `heartbeat_s`)."""

    def __init__(self, redis, key_prefix: str, clock: Callable[[], float],
                 policy: AdmissionPolicy, max_queue: int, heartbeat_s: float = 5.0,
                 slot_ttl_s: float = 30.0, fallback_poll_s: float = 1.0):
        if not 0 < fallback_poll_s < heartbeat_s:
            raise ValueError("fallback_poll_s must be positive and below heartbeat_s")
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock
        self._max_queue = max_queue
        self._heartbeat_ms = int(heartbeat_s * 1000)
        self._slot_ttl_ms = int(slot_ttl_s * 1000)
        self._fallback_poll_s = fallback_poll_s
        common = _COMMON % {"buckets": ", ".join(map(str, WAIT_BUCKETS_MS)),
                            "pick": policy.pick_lua}
        # record_wait(0)'s histogram bucket, for the entry's common case
        direct = _ENTER_DIRECT % {"zero_wait_bucket": next(
            (i for i, bound in enumerate(WAIT_BUCKETS_MS, 1) if bound >= 0),
            len(WAIT_BUCKETS_MS) + 1)}
        self._enter = redis.register_script(_HEAD + direct + common + _ENTER)
        self._poll = redis.register_script(_HEAD + common + _POLL)
        self._leave = redis.register_script(_HEAD + common + _LEAVE)
        self.wakeups = WakeUps(redis, redis_keys.admission_wake_channel(key_prefix))

    def keys(self, model: str) -> list[str]:
        return queue_keys(self._prefix, model)

    def models_key(self) -> str:
        return redis_keys.admission_models(self._prefix)

    def _common_args(self, model: str) -> list:
        return [int(self._clock() * 1000), self._slot_ttl_ms, self.wakeups.channel]

    async def admit(self, model: str, model_version_id: int, waiter: Waiter, capacity: int,
                    headroom: int = 0,
                    refresh: Callable[[], Awaitable[tuple[int, int]]] | None = None,
                    also: Callable[[object], Callable[[list], Awaitable[None]]] | None = None,
                    on_wait: Callable[[], None] | None = None,
                    ) -> Slot:
        """A slot of `model_version_id` (one of `model`'s versions, which has `capacity`
        slots), at once or after waiting; QueueFull / QueueTimeout otherwise. Cancelling the
        caller while it waits leaves the queue. `headroom`: slots beyond `capacity` only for
        tenants under their fair share of `capacity`. `refresh`: re-reads (capacity, headroom) before each
        poll, for a version whose capacity is growing (its first replica is loading; no release
        wakes such a waiter, so it finds the new capacity on its fallback poll). `also(pipe)`:
        queues more commands to send with the entry, in the same round trip, and returns the
        `finish(results)` awaited with their results (or the exception that failed the call).
        `on_wait()`: called once the entry says the request must wait, before it waits."""
        ticket = f"{waiter.tenant}:{model_version_id}:{random_hex()}"
        keys = self.keys(model)
        started = self._clock()
        try:
            state = await self._enter_call([*keys, self.models_key()], [
                *self._common_args(model), ticket, waiter.priority, waiter.tenant,
                waiter.cost_tokens, model_version_id, capacity, headroom, self._max_queue,
                self._heartbeat_ms, model], also)
        except BaseException:
            await self._leave_quietly(model, ticket)
            raise
        if state == -1:
            raise QueueFull()
        if state != 1:
            if on_wait is not None:
                on_wait()
            async with self.wakeups.expect(ticket):
                await self._wait(model, model_version_id, waiter, ticket, capacity, headroom,
                                 refresh, started)
        return Slot(self, model, model_version_id, ticket, self._clock() - started,
                    queued=state != 1)

    async def _enter_call(self, keys: list, args: list, also) -> int:
        if also is None:
            return int(await self._enter(keys=keys, args=args))
        pipe = self._redis.pipeline(transaction=False)
        finish = also(pipe)
        queue_script(pipe, self._enter, keys, args)
        try:
            results = await pipe.execute(raise_on_error=False)
        except BaseException as exc:
            await finish([exc])
            raise
        await finish(results[:-1])
        state = results[-1]
        if isinstance(state, NoScriptError):  # Redis lost its scripts: load it and enter
            return int(await self._enter(keys=keys, args=args))
        if isinstance(state, BaseException):
            raise state
        return int(state)

    async def _wait(self, model, model_version_id, waiter, ticket, capacity, headroom,
                    refresh, started) -> None:
        """Queued: wait for the pump to hand this ticket a slot (subscribed now: the first
        poll, at once, catches a wake-up published before the subscription)."""
        keys = self.keys(model)
        try:
            state = 0
            first = True
            while state != 1:
                remaining = waiter.max_wait_s - (self._clock() - started)
                if remaining <= 0:
                    await self.leave(model, ticket, "timeout")
                    raise QueueTimeout()
                if not first:
                    await self.wait_for_wake(model, ticket,
                                             min(self._fallback_poll_s, remaining))
                    if refresh is not None:
                        capacity, headroom = await refresh()
                first = False
                state = int(await self._poll(keys=keys, args=[
                    *self._common_args(model), ticket, model_version_id, capacity, headroom,
                    self._heartbeat_ms]))
                if state == -2:
                    raise QueueTimeout()
        except (QueueFull, QueueTimeout):
            raise
        except BaseException:
            # Cancelled, or Redis failed mid-wait: leave the queue (or free the slot the pump
            # may already have handed over), bounded; what fails expires (heartbeat, slot TTL).
            await self._leave_quietly(model, ticket)
            raise

    async def _leave_quietly(self, model: str, ticket: str) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self.leave(model, ticket)),
                                   self._fallback_poll_s * 2)
        except Exception:  # noqa: BLE001 - its heartbeat or slot TTL runs out instead
            pass

    async def wait_for_wake(self, model: str, ticket: str, timeout_s: float) -> bool:
        """Block until the pump wakes this ticket, or `timeout_s` passes."""
        return await self.wakeups.wait(ticket, timeout_s)

    async def refresh(self, model: str, ticket: str) -> bool:
        """Extend a held slot's lease; False when it is no longer held (expired, reclaimed)."""
        expiry = int(self._clock() * 1000) + self._slot_ttl_ms
        # XX: never re-creates a reclaimed slot; CH: counts the updated score (1 when held).
        return bool(await self._redis.zadd(self.keys(model)[1], {ticket: expiry}, xx=True,
                                           ch=True))

    async def close(self) -> None:
        await self.wakeups.close()

    async def leave(self, model: str, ticket: str, reason: str = "") -> None:
        await self._leave(keys=self.keys(model), args=[
            *self._common_args(model), ticket, reason])
