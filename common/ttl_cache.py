"""TtlCache: values loaded by an async function, each reused for `ttl_s` of an injected clock.

The request path's in-process caches of PostgreSQL reads (serving versions, ready replicas,
live rollouts) are all this one class.

Invariants:
- a value returned was loaded at most `ttl_s` ago by the clock (0 = never reused), except
  while it is being reloaded (below, `stale_while_loading_s`);
- at most `max_entries` keys are held; when full, all are dropped at once (cheap, and every
  entry is at most `ttl_s` from being reloaded anyway);
- `update(key, change)` rewrites a held value without touching its load time (forgetting a
  broken replica until the next load), and does nothing for a key not held;
- `stamp(value)`, when given, says when the value was read from its source (a shared cache's
  own write time, on the same clock): the value is reused until `ttl_s` after that, not after
  this cache's load, so a cache in front of another cache does not add the two TTLs;
- `forget(key)` / `clear()` drop entries at once (invalidation from outside), and what a load
  or reload running then read is not kept (it may predate the invalidation: a revoked key's
  principal read just before the revocation).

Refresh ahead (`refresh_after_s`): a value asked for when it is older than that, but still
fresh, is returned at once and reloaded in the background (one reload per key at a time, by
`refresh`, default `load`), so that under steady traffic no caller waits for the source: the
value is replaced before it expires. Before, every request that found a value expired read
it again (the registry caches' PostgreSQL reads, with a thread hop each, about a fifth of the
API's CPU per short request at 150 requests/s: benchmarks/README.md, "gateway"), and waiting
for one shared load instead deadlocked a small connection pool. Nobody waits for a background
reload, so it cannot. It runs in an empty context (it belongs to no request: not to the
request's ORM thread, deadline or logging context). The invariant above holds: a reload only
replaces a value, older than itself, that is still held; one that fails is logged and the value
expires as usual (the next caller then loads it, and sees the failure); `forget`/`clear` during
a reload discard what it read. Values with a `stamp` (read from another cache) are not
refreshed ahead: the other cache would answer with the same stamp.

One load at a time (`stale_while_loading_s`): traffic in bursts further apart than the TTL
finds the value expired all at once, and every request of the burst read it again (32 loads
of each registry entry at the start of each of `benchmarks.gateway`'s rounds of 32 streams).
With this set, the first caller that finds a held value expired loads it, as before, and
callers arriving while that load (or a background reload) runs get the held value, if it
expired less than `stale_while_loading_s` ago, instead of loading it again. Nobody waits for
another caller's load (the deadlock above cannot happen); a value is then at most `ttl_s`
plus one load old (at most `ttl_s + stale_while_loading_s`, however slow the load); a load
that fails leaves the next caller to load it.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
from typing import Awaitable, Callable, Generic, Hashable, TypeVar

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    def __init__(self, load: Callable[[K], Awaitable[V]], clock: Callable[[], float],
                 ttl_s: float, max_entries: int = 10_000,
                 stamp: Callable[[V], float] | None = None, *,
                 refresh_after_s: float | None = None,
                 refresh: Callable[[K], Awaitable[V]] | None = None,
                 stale_while_loading_s: float = 0.0):
        if refresh_after_s is not None and stamp is not None:
            raise ValueError("stamped values are not refreshed ahead")
        self._load = load
        self._stamp = stamp
        self._clock = clock
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._held: dict[K, tuple[float, V]] = {}
        self._refresh_after_s = (refresh_after_s if refresh_after_s is not None
                                 and refresh_after_s < ttl_s else None)
        self._refresh = refresh or load
        self._stale_s = stale_while_loading_s
        self._loading: dict[K, int] = {}  # callers loading a key now (not background reloads)
        self._refreshing: dict[K, asyncio.Task] = {}
        self._epoch = 0  # forget/clear: reloads started before them are discarded

    async def get(self, key: K) -> V:
        now = self._clock()
        hit = self._held.get(key)
        if hit is not None:
            age = now - hit[0]
            if age < self._ttl_s:
                if (self._refresh_after_s is not None and age >= self._refresh_after_s
                        and key not in self._refreshing):
                    self._refreshing[key] = asyncio.get_running_loop().create_task(
                        self._reload(key, now, self._epoch), context=contextvars.Context())
                return hit[1]
            if age < self._ttl_s + self._stale_s and (
                    key in self._loading or key in self._refreshing):
                return hit[1]  # expired, and being read again now: not once per caller
        epoch = self._epoch
        self._loading[key] = self._loading.get(key, 0) + 1
        try:
            value = await self._load(key)
        finally:
            left = self._loading.pop(key) - 1
            if left:
                self._loading[key] = left
        if epoch == self._epoch:  # else forgotten meanwhile: this caller's answer, not kept
            self._put(key, now if self._stamp is None else min(now, self._stamp(value)), value)
        return value

    def _put(self, key: K, loaded_at: float, value: V) -> None:
        if len(self._held) >= self._max_entries and key not in self._held:
            self._held.clear()
        self._held[key] = (loaded_at, value)

    async def _reload(self, key: K, started: float, epoch: int) -> None:
        try:
            value = await self._refresh(key)
        except Exception:  # noqa: BLE001 - the value expires; its next caller loads it
            logger.warning("reloading %r ahead of its expiry failed; it is loaded when it "
                           "expires", key, exc_info=True)
            return
        finally:
            self._refreshing.pop(key, None)
        held = self._held.get(key)
        if epoch == self._epoch and held is not None and held[0] <= started:
            self._held[key] = (started, value)

    async def refreshed(self) -> None:
        """Wait for the background reloads running now (tests; a clean shutdown)."""
        while self._refreshing:
            await asyncio.wait(list(self._refreshing.values()))

    def forget(self, key: K) -> None:
        self._epoch += 1
        self._held.pop(key, None)

    def clear(self) -> None:
        self._epoch += 1
        self._held.clear()

    def update(self, key: K, change: Callable[[V], V]) -> None:
        hit = self._held.get(key)
        if hit is not None:
            self._held[key] = (hit[0], change(hit[1]))
