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
