"""common/: the one TTL cache and the one per-event-loop holder (pure; injected clock)."""
from __future__ import annotations

import asyncio

import pytest

from common.per_loop import PerLoop
from common.ttl_cache import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.asyncio
async def test_ttl_cache_reuses_a_value_for_ttl_then_loads_again():
    clock, loads = Clock(), []

    async def load(key):
        loads.append(key)
        return f"{key}@{clock.now}"

    cache = TtlCache(load, clock, ttl_s=5.0)
    assert await cache.get("a") == "a@0.0"
    clock.now = 4.999
    assert await cache.get("a") == "a@0.0"
    clock.now = 5.0
    assert await cache.get("a") == "a@5.0"
    assert loads == ["a", "a"]


@pytest.mark.asyncio
async def test_ttl_cache_zero_ttl_always_loads_and_update_keeps_the_load_time():
    clock = Clock()
    calls = []

    async def load(key):
        calls.append(key)
        return [1, 2, 3]

    never = TtlCache(load, clock, ttl_s=0.0)
    await never.get(1)
    await never.get(1)
    assert calls == [1, 1]
    calls.clear()
    cache = TtlCache(load, clock, ttl_s=10.0)
    await cache.get(7)
    cache.update(7, lambda held: [x for x in held if x != 2])
    cache.update(8, lambda held: pytest.fail("not held: never called"))
    clock.now = 9.0
    assert await cache.get(7) == [1, 3]
    clock.now = 10.0
    assert await cache.get(7) == [1, 2, 3]
    assert calls == [7, 7]


@pytest.mark.asyncio
async def test_ttl_cache_drops_everything_when_full():
    clock = Clock()

    async def load(key):
        return key

    cache = TtlCache(load, clock, ttl_s=60.0, max_entries=2)
    await cache.get(1)
    await cache.get(2)
    await cache.get(3)  # full: 1 and 2 dropped
    assert cache._held.keys() == {3}



@pytest.mark.asyncio
async def test_ttl_cache_refreshes_ahead_in_the_background_and_no_caller_waits():
    clock, loads = Clock(), []
    gate = asyncio.Event()

    async def load(key):
        loads.append(("load", clock.now))
        return f"{key}@{clock.now}"

    async def refresh(key):
        loads.append(("refresh", clock.now))
        await gate.wait()  # the source is slow: callers keep getting the held value
        return f"{key}@refreshed-{clock.now}"

    cache = TtlCache(load, clock, ttl_s=4.0, refresh_after_s=3.0, refresh=refresh)
    assert await cache.get("a") == "a@0.0"
    clock.now = 2.9
    assert await cache.get("a") == "a@0.0"  # not yet due
    assert loads == [("load", 0.0)]
    clock.now = 3.0
    assert await cache.get("a") == "a@0.0"  # due: held value now, a reload started
    clock.now = 3.5
    assert await cache.get("a") == "a@0.0"  # one reload at a time
    await asyncio.sleep(0)
    assert loads == [("load", 0.0), ("refresh", 3.5)]
    gate.set()
    await cache.refreshed()
    # The reload replaced the value; its age counts from when it was started (3.0).
    clock.now = 6.9
    assert await cache.get("a") == "a@refreshed-3.5"  # due again (3.9 old): another reload
    await asyncio.sleep(0)
    assert loads == [("load", 0.0), ("refresh", 3.5), ("refresh", 6.9)]
    await cache.refreshed()


@pytest.mark.asyncio
async def test_ttl_cache_refresh_ahead_keeps_the_ttl_invariant_when_a_reload_is_slow_or_fails():
    clock = Clock()
    gate = asyncio.Event()
    fail = {"on": False}

    async def load(key):
        return ("loaded", clock.now)

    async def refresh(key):
        started = clock.now
        await gate.wait()
        if fail["on"]:
            raise RuntimeError("PostgreSQL away")
        return ("refreshed", started)

    cache = TtlCache(load, clock, ttl_s=4.0, refresh_after_s=3.0, refresh=refresh)
    await cache.get("a")
    clock.now = 3.0
    await cache.get("a")  # a reload starts, and hangs
    clock.now = 4.0  # expired: the caller loads it itself, never an older value
    assert await cache.get("a") == ("loaded", 4.0)
    gate.set()
    await cache.refreshed()  # the reload read at 3.0 lands after a newer load: discarded
    assert await cache.get("a") == ("loaded", 4.0)
    # A failing reload leaves the value to expire; the next caller then loads it.
    fail["on"] = True
    clock.now = 7.0
    assert await cache.get("a") == ("loaded", 4.0)
    await cache.refreshed()
    clock.now = 7.5
    assert await cache.get("a") == ("loaded", 4.0)  # still fresh, no reload piles up
    clock.now = 8.0
    assert await cache.get("a") == ("loaded", 8.0)
    await cache.refreshed()


@pytest.mark.asyncio
async def test_ttl_cache_a_reload_started_before_forget_is_discarded():
    clock = Clock()
    gate = asyncio.Event()
    source = {"value": "revoked-later"}

    async def load(key):
        return source["value"]

    async def refresh(key):
        value = source["value"]  # read before the invalidation
        await gate.wait()
        return value

    cache = TtlCache(load, clock, ttl_s=4.0, refresh_after_s=3.0, refresh=refresh)
    await cache.get("k")
    clock.now = 3.0
    await cache.get("k")  # reload in flight with the old value
    source["value"] = "new"
    cache.forget("k")  # invalidation from outside
    assert await cache.get("k") == "new"
    gate.set()
    await cache.refreshed()
    assert await cache.get("k") == "new"  # the reload's older read did not come back
    # A caller's own load that straddles the invalidation answers that caller, and is not kept.
    slow = asyncio.Event()

    async def slow_load(key):
        value = source["value"]
        await slow.wait()
        return value

    straddling = TtlCache(slow_load, clock, ttl_s=4.0)
    source["value"] = "before-revocation"
    first = asyncio.create_task(straddling.get("k"))
    await asyncio.sleep(0)
    source["value"] = "after-revocation"
    straddling.forget("k")
    slow.set()
    assert await first == "before-revocation"
    assert await straddling.get("k") == "after-revocation"


@pytest.mark.asyncio
async def test_ttl_cache_reloads_in_a_context_of_their_own():
    import contextvars
    request_id = contextvars.ContextVar("request_id", default=None)
    seen = []
    clock = Clock()

    async def load(key):
        return key

    async def refresh(key):
        seen.append(request_id.get())
        return key

    cache = TtlCache(load, clock, ttl_s=4.0, refresh_after_s=3.0, refresh=refresh)
    request_id.set("req-1")
    await cache.get("x")
    clock.now = 3.0
    await cache.get("x")
    await cache.refreshed()
    assert seen == [None]  # not the request's context (its ORM thread, deadline, logging)
    with pytest.raises(ValueError):
        TtlCache(load, clock, ttl_s=4.0, stamp=lambda v: 0.0, refresh_after_s=3.0)



@pytest.mark.asyncio
async def test_ttl_cache_a_burst_finding_a_value_expired_loads_it_once():
    clock, loads = Clock(), []
    gate = asyncio.Event()

    async def load(key):
        read_at = clock.now
        loads.append(read_at)
        if len(loads) > 1:
            await gate.wait()  # the second load is slow: a burst arrives meanwhile
        return f"{key}@{read_at}"

    cache = TtlCache(load, clock, ttl_s=1.0, stale_while_loading_s=1.0)
    assert await cache.get("v") == "v@0.0"
    clock.now = 1.5  # expired: the burst's first caller loads it
    first = asyncio.create_task(cache.get("v"))
    await asyncio.sleep(0)
    burst = await asyncio.gather(*(cache.get("v") for _ in range(31)))
    assert burst == ["v@0.0"] * 31  # the held value while it is read again, no 31 more loads
    clock.now = 2.0  # too long past its expiry (1 s + 1 s): a caller loads it itself
    late = asyncio.create_task(cache.get("v"))
    await asyncio.sleep(0)
    gate.set()
    assert await first == "v@1.5" and await late == "v@2.0"
    assert loads == [0.0, 1.5, 2.0]
    # Without the option every caller that finds it expired loads it (the former way).
    plain_loads = []

    async def plain_load(key):
        plain_loads.append(key)
        await asyncio.sleep(0)
        return key

    plain = TtlCache(plain_load, clock, ttl_s=1.0)
    await plain.get("v")
    clock.now = 5.0
    await asyncio.gather(*(plain.get("v") for _ in range(3)))
    assert len(plain_loads) == 4


@pytest.mark.asyncio
async def test_ttl_cache_a_failed_load_leaves_the_next_caller_to_load():
    clock = Clock()
    outcomes = ["ok", "fail", "ok"]

    async def load(key):
        if outcomes.pop(0) == "fail":
            raise RuntimeError("PostgreSQL away")
        return clock.now

    cache = TtlCache(load, clock, ttl_s=1.0, stale_while_loading_s=1.0)
    await cache.get("k")
    clock.now = 1.2
    with pytest.raises(RuntimeError):
        await cache.get("k")
    assert await cache.get("k") == 1.2  # nobody is loading it any more: this caller does


def test_per_loop_gives_each_loop_its_own_object():
    made = []
    holder = PerLoop(lambda: made.append(object()) or made[-1])

    async def twice():
        return holder.current(), holder.current()

    first_a, first_b = asyncio.run(twice())
    second_a, _ = asyncio.run(twice())
    assert first_a is first_b and first_a is not second_a and len(made) == 2
    loop = asyncio.new_event_loop()
    try:
        holder.set(loop, "mine")
        assert holder.get(loop) == "mine" and holder.pop(loop) == "mine" and holder.get(loop) is None
    finally:
        loop.close()


def test_per_loop_forgets_a_popped_or_replaced_object_and_keeps_no_loop_alive():
    import gc
    import weakref

    made = []
    holder = PerLoop(lambda: made.append(object()) or made[-1])
    loop = asyncio.new_event_loop()

    async def current():
        return holder.current()

    try:
        first = loop.run_until_complete(current())
        assert loop.run_until_complete(current()) is first  # the remembered answer
        assert holder.pop(loop) is first
        second = loop.run_until_complete(current())  # not the popped one
        assert second is not first
        holder.set(loop, "replaced")
        assert loop.run_until_complete(current()) == "replaced"
    finally:
        loop.close()
    gone = weakref.ref(loop)
    del loop
    gc.collect()
    assert gone() is None  # the remembered answer holds its loop weakly
