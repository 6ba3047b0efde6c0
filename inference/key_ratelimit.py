"""A request rate per API key in front of the API (settings.API_KEY_RATELIMIT, e.g. `6000/m`).

A coarse guard against a runaway client; the per-tenant token buckets (inference/quota.py)
carry the contractual limits. Counted in Redis in fixed windows (each key's windows offset by a
hash of its id, like django-ratelimit's), so every process shares the count.

Invariants: the count is keyed on the authenticated key's id, so spellings of one key
(`Bearer` vs `bearer`, extra spaces) share one count and junk headers create none; every request
counts, HTTP and WebSocket alike. A request that reaches the token buckets is counted in the
same Lua call as the buckets (`tenants.buckets.TokenBuckets.check`: no round trip of its own);
one refused earlier (a bad body, an unknown model, a replay) is counted on its own by
`count_alone`, which refuses it with the 429 when the key is over its rate.
"""
from __future__ import annotations

import functools
import re
import time
import zlib
from dataclasses import dataclass
from typing import Callable

from common import redis_keys
from inference.errors import RateLimited
from llm_platform.hot_settings import settings
from tenants.buckets import WindowCount

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

# INCR the window's counter (expiring at the window's end); returns the count.
_COUNT = """
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n
"""


@functools.lru_cache(maxsize=8)  # the setting, parsed once (key_rate runs per request)
def parse_rate(rate: str) -> tuple[int, int]:
    """`N/u` or `N/ku` (u: s, m, h, d) -> (limit, window in ms)."""
    match = _RATE.match(rate)
    if match is None:
        raise ValueError(f"API_KEY_RATELIMIT {rate!r} is not like '6000/m'")
    limit, multiple, unit = match.groups()
    return int(limit), int(multiple or 1) * _UNIT_MS[unit]


@dataclass
class KeyRate:
    """One request's count against its key's rate; `counted` once a call has counted it."""

    count: WindowCount
    counted: bool = False


def key_rate(key_prefix: str, api_key_id: int,
             clock: Callable[[], float] = time.time) -> KeyRate | None:
    """The count for one request of this key now (None: no rate configured)."""
    if not settings.API_KEY_RATELIMIT:
        return None
    limit, window_ms = parse_rate(settings.API_KEY_RATELIMIT)
    shifted = int(clock() * 1000) + zlib.crc32(str(api_key_id).encode()) % window_ms
    window, into = divmod(shifted, window_ms)
    return KeyRate(WindowCount(redis_keys.key_rate(key_prefix, api_key_id, window), limit,
                               window_ms - into))


def refusal(retry_ms: int) -> RateLimited:
    retry_after = max(1, -(-retry_ms // 1000))
    return RateLimited(f"Too many requests with this API key ({settings.API_KEY_RATELIMIT}).",
                       code="api_key_rate_exceeded", headers={"Retry-After": str(retry_after)})


async def count_alone(redis, rate: KeyRate) -> None:
    """Count a request that never reached the buckets; RateLimited over the rate."""
    if rate.counted:
        return
    rate.counted = True
    count = int(await redis.eval(_COUNT, 1, rate.count.key, max(1, rate.count.window_left_ms)))
    if count > rate.count.limit:
        raise refusal(rate.count.window_left_ms)
