"""Per-tenant token buckets (requests/min and tokens/min) kept in Redis.

Each check is one Lua script over both buckets, so it is atomic across any number of platform
processes: a request is admitted only if both buckets hold enough, and then both are charged.
A bucket refills continuously at `per_minute / 60` per second up to its `burst` capacity.

Invariants:
- the level of a bucket never exceeds its burst; it may go below zero only through
  `correct` (actual usage above the estimate), and then later requests wait until it refills;
- time comes from the caller's injected clock (milliseconds); a clock reading older than the
  bucket's last update refills nothing (several processes' clocks never run a bucket back).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from tenants.selectors import Limits
from common import redis_keys
from common.pipelines import run_script

# KEYS: requests bucket, tokens bucket.
# ARGV: now_ms, req_per_min, req_burst, tok_per_min, tok_burst, num_tokens, ttl_ms.
# Returns {admitted (0/1), wait_ms, requests level, tokens level} (levels as strings: Lua
# numbers returned to Redis are truncated to integers).
_REFILL = """
local function refill(key, now, per_min, burst)
  local stored = redis.call('HMGET', key, 'level', 'ts')
  local level, ts = tonumber(stored[1]), tonumber(stored[2])
  if level == nil or ts == nil then return burst, now end
  if now > ts then
    level = math.min(burst, level + (now - ts) * per_min / 60000.0)
    ts = now
  end
  return level, ts
end
-- `level` as the string it is stored and returned as (string.format once per bucket).
local function store(key, level, ts, ttl)
  redis.call('HSET', key, 'level', level, 'ts', string.format('%d', ts))
  redis.call('PEXPIRE', key, ttl)
end
"""

# KEYS[3] (optional): a fixed-window request counter counted first (ARGV[8]: its limit,
# ARGV[9]: ms to the window's end); over its limit nothing is charged and the 5th value
# returned is the ms until the window ends (-1 otherwise).
CHECK_SCRIPT = _REFILL + """
local now = tonumber(ARGV[1])
local req_per_min, req_burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local tok_per_min, tok_burst = tonumber(ARGV[4]), tonumber(ARGV[5])
local cost, ttl = tonumber(ARGV[6]), tonumber(ARGV[7])
local req, req_ts = refill(KEYS[1], now, req_per_min, req_burst)
local tok, tok_ts = refill(KEYS[2], now, tok_per_min, tok_burst)
if KEYS[3] then
  local count = redis.call('INCR', KEYS[3])
  if count == 1 then redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[9])) end
  if count > tonumber(ARGV[8]) then
    return {0, 0, string.format('%.17g', req), string.format('%.17g', tok), tonumber(ARGV[9])}
  end
end
if req >= 1 and tok >= cost then
  local req_s = string.format('%.17g', req - 1)
  local tok_s = string.format('%.17g', tok - cost)
  store(KEYS[1], req_s, req_ts, ttl)
  store(KEYS[2], tok_s, tok_ts, ttl)
  return {1, 0, req_s, tok_s, -1}
end
local wait = 0
if req < 1 then wait = math.max(wait, (1 - req) * 60000.0 / req_per_min) end
if tok < cost then wait = math.max(wait, (cost - tok) * 60000.0 / tok_per_min) end
return {0, math.ceil(wait), string.format('%.17g', req), string.format('%.17g', tok), -1}
"""

# KEYS: tokens bucket. ARGV: now_ms, tok_per_min, tok_burst, delta (charge > 0, refund < 0),
# ttl_ms. Returns the new level. A refund never lifts the level above the burst.
CORRECT_SCRIPT = _REFILL + """
local now, per_min, burst = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local delta, ttl = tonumber(ARGV[4]), tonumber(ARGV[5])
local level, ts = refill(KEYS[1], now, per_min, burst)
level = string.format('%.17g', math.min(burst, level - delta))
store(KEYS[1], level, ts, ttl)
return level
"""


def bucket_keys(key_prefix: str, tenant_id: int) -> tuple[str, str]:
    """The Redis hashes of a tenant's requests and tokens buckets."""
    return redis_keys.token_buckets(key_prefix, tenant_id)


def level_now(stored_level, stored_ts_ms, now_ms: int, per_minute: int, burst: int) -> float:
    """A bucket's level at `now_ms` from its hash's raw `level` and `ts` fields (None when the
    bucket does not exist: full), refilled as the Lua `refill` would. The one refill for reads,
    which need no script: they write nothing."""
    if stored_level is None or stored_ts_ms is None:
        return float(burst)
    level, ts_ms = float(stored_level), int(stored_ts_ms)
    if now_ms <= ts_ms:
        return level
    return min(float(burst), level + (now_ms - ts_ms) * per_minute / 60000.0)


def _refill_s(missing: float, per_minute: int) -> float:
    if per_minute <= 0:  # a suspended tenant's bucket: nothing to wait for
        return 0.0
    return max(0.0, missing * 60.0 / per_minute)


@dataclass(frozen=True)
class WindowCount:
    """A fixed-window request counter counted in the same call as the buckets: `key` counts
    the current window, which ends in `window_left_ms`; more than `limit` requests in it are
    refused (BucketState.window_retry_ms) and charge nothing."""

    key: str
    limit: int
    window_left_ms: int


@dataclass(frozen=True)
class BucketState:
    """What the x-ratelimit-* headers report after a check (or a peek: not admitted, no wait,
    nothing charged)."""

    limits: Limits
    admitted: bool
    wait_ms: int  # 0 when admitted: how long until this request would be admitted
    requests_level: float
    tokens_level: float
    window_retry_ms: int = -1  # >= 0: refused by the WindowCount, which resets in this many ms

    def reset_requests_s(self) -> float:
        """Seconds until the requests bucket is full again (0 when it never refills)."""
        return _refill_s(self.limits.request_burst - self.requests_level,
                         self.limits.requests_per_minute)

    def reset_tokens_s(self) -> float:
        return _refill_s(self.limits.token_burst - self.tokens_level,
                         self.limits.tokens_per_minute)

    @property
    def retry_after_s(self) -> int:
        """Whole seconds (at least 1) after which this request would be admitted."""
        return max(1, math.ceil(self.wait_ms / 1000.0))


class TokenBuckets:
    """The two buckets of each tenant. `redis` is an asyncio client, `clock` returns wall-clock
    seconds (shared by every process on the fleet, unlike a monotonic clock)."""

    def __init__(self, redis, key_prefix: str, clock: Callable[[], float]):
        self._redis = redis
        self._prefix = key_prefix
        self._clock = clock
        self._check = redis.register_script(CHECK_SCRIPT)
        self._correct = redis.register_script(CORRECT_SCRIPT)

    def keys(self, tenant_id: int) -> tuple[str, str]:
        return bucket_keys(self._prefix, tenant_id)

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    @staticmethod
    def _ttl_ms(limits: Limits) -> int:
        # Long enough to refill completely from empty; an expired bucket reads as full.
        full_ms = max(limits.request_burst * 60000 // max(1, limits.requests_per_minute),
                      limits.token_burst * 60000 // max(1, limits.tokens_per_minute))
        return int(full_ms) + 60_000

    async def check(self, limits: Limits, num_tokens: int,
                    count: WindowCount | None = None) -> BucketState:
        """Admit and charge one request of `num_tokens` (estimated), or say how long to wait.
        `count`: also count the request in a fixed window, first (one round trip for both)."""
        keys = list(self.keys(limits.tenant_id))
        args = [self._now_ms(), limits.requests_per_minute, limits.request_burst,
                limits.tokens_per_minute, limits.token_burst, num_tokens, self._ttl_ms(limits)]
        if count is not None:
            keys.append(count.key)
            args += [count.limit, max(1, count.window_left_ms)]
        admitted, wait_ms, req_level, tok_level, window_retry_ms = await run_script(
            self._check, keys, args)
        return BucketState(limits, bool(int(admitted)), int(wait_ms), float(req_level),
                           float(tok_level), int(window_retry_ms))

    async def peek(self, limits: Limits) -> BucketState:
        """Both buckets' levels now, charging nothing (a plain read, refilled in Python)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in self.keys(limits.tenant_id):
                pipe.hmget(key, "level", "ts")
            (req_level, req_ts), (tok_level, tok_ts) = await pipe.execute()
        now_ms = self._now_ms()
        return BucketState(
            limits, False, 0,
            level_now(req_level, req_ts, now_ms, limits.requests_per_minute,
                      limits.request_burst),
            level_now(tok_level, tok_ts, now_ms, limits.tokens_per_minute,
                      limits.token_burst))

    def queue_correct(self, batch, limits: Limits, delta_tokens: int) -> None:
        """`correct` queued on a `common.pipelines.Batch` (the request's end)."""
        batch.script(self._correct, [self.keys(limits.tenant_id)[1]],
                     [self._now_ms(), limits.tokens_per_minute, limits.token_burst,
                      delta_tokens, self._ttl_ms(limits)])

    async def correct(self, limits: Limits, delta_tokens: int) -> float:
        """Charge `delta_tokens` more (negative: refund); the level may go below zero."""
        level = await self._correct(
            keys=[self.keys(limits.tenant_id)[1]],
            args=[self._now_ms(), limits.tokens_per_minute, limits.token_burst, delta_tokens,
                  self._ttl_ms(limits)])
        return float(level)
