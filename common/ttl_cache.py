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
- `forget(key)` / `clear()` drop entries at once (invalidation from outside); a caller after
  them does not wait for a load that was under way before them (which still stores its value,
  as a load always has);
- one load at a time per key (`ttl_s` > 0): callers that find the value missing or stale
  while it is being loaded wait for that load rather than start their own (a burst of
  requests at the moment a registry entry expires made one PostgreSQL read each); when that
  load fails they get its error, and when its caller is cancelled they load it themselves.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Abandoned(Exception):
    """The load a caller waited for was cancelled with its own caller."""


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
        self._loading: dict[K, asyncio.Future] = {}  # the load under way, per key

    async def get(self, key: K) -> V:
        while True:
            now = self._clock()
            hit = self._held.get(key)
            if hit is not None and now - hit[0] < self._ttl_s:
                return hit[1]
            shared = self._loading.get(key) if self._ttl_s > 0 else None
            if shared is None or shared.get_loop() is not asyncio.get_running_loop():
                return await self._load_now(key, now)
            try:
                return await asyncio.shield(shared)
            except _Abandoned:
                continue  # its caller was cancelled: load it here

    async def _load_now(self, key: K, now: float) -> V:
        loading = asyncio.get_running_loop().create_future()
        self._loading[key] = loading
        try:
            value = await self._load(key)
        except BaseException as exc:
            if self._loading.get(key) is loading:
                del self._loading[key]
            loading.set_exception(exc if isinstance(exc, Exception) else _Abandoned())
            loading.exception()  # retrieved: nobody may have waited for it
            raise
        if self._loading.get(key) is loading:
            del self._loading[key]
        if len(self._held) >= self._max_entries and key not in self._held:
            self._held.clear()
        self._held[key] = (now if self._stamp is None else min(now, self._stamp(value)), value)
        loading.set_result(value)
        return value

    def forget(self, key: K) -> None:
        self._held.pop(key, None)
        self._loading.pop(key, None)

    def clear(self) -> None:
        self._held.clear()
        self._loading.clear()

    def update(self, key: K, change: Callable[[V], V]) -> None:
        hit = self._held.get(key)
        if hit is not None:
            self._held[key] = (hit[0], change(hit[1]))
