"""TtlCache: values loaded by an async function, each reused for `ttl_s` of an injected clock.

The request path's in-process caches of PostgreSQL reads (serving versions, ready replicas,
live rollouts) are all this one class.

Invariants:
- a value returned was loaded at most `ttl_s` ago by the clock (0 = never reused);
- at most `max_entries` keys are held; when full, all are dropped at once (cheap, and every
  entry is at most `ttl_s` from being reloaded anyway);
- `update(key, change)` rewrites a held value without touching its load time (forgetting a
  broken replica until the next load), and does nothing for a key not held;
- `stamp(value)`, when given, says when the value was read from its source (a shared cache's
  own write time, on the same clock): the value is reused until `ttl_s` after that, not after
  this cache's load, so a cache in front of another cache does not add the two TTLs;
- `forget(key)` / `clear()` drop entries at once (invalidation from outside).
"""
from __future__ import annotations

from typing import Awaitable, Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    def __init__(self, load: Callable[[K], Awaitable[V]], clock: Callable[[], float],
                 ttl_s: float, max_entries: int = 10_000,
                 stamp: Callable[[V], float] | None = None):
        self._load = load
        self._stamp = stamp
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._held: dict[K, tuple[float, V]] = {}

    async def get(self, key: K) -> V:
        now = self._clock()
        hit = self._held.get(key)
        if hit is not None and now - hit[0] < self._ttl_s:
            return hit[1]
        value = await self._load(key)
        if len(self._held) >= self._max_entries and key not in self._held:
            self._held.clear()
        self._held[key] = (now if self._stamp is None else min(now, self._stamp(value)), value)
        return value

    def forget(self, key: K) -> None:
        self._held.pop(key, None)

    def clear(self) -> None:
        self._held.clear()

    def update(self, key: K, change: Callable[[V], V]) -> None:
        hit = self._held.get(key)
        if hit is not None:
            self._held[key] = (hit[0], change(hit[1]))
