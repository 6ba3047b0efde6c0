"""common/deadlines.py: the bound of asyncio.timeout_at, one timer per loop.

Each test waits on the bound itself (the TimeoutError it raises, or an event the test sets):
deadlines are a few resolutions away, and nothing here sleeps to let time pass."""
from __future__ import annotations

import asyncio

import pytest

from common.deadlines import Deadlines

RESOLUTION_S = 0.01
pytestmark = pytest.mark.asyncio


async def test_a_block_past_its_deadline_leaves_as_timeout_error():
    deadlines = Deadlines(RESOLUTION_S)
    loop = asyncio.get_running_loop()
    started = loop.time()
    bound = deadlines.at(started + 0.03)
    with pytest.raises(TimeoutError):
        async with bound:
            await asyncio.Event().wait()  # never set: only the deadline ends it
    waited = loop.time() - started
    assert bound.expired()
    assert 0.03 <= waited  # never early; late by at most a tick (not asserted: a busy machine)
    assert deadlines.open_count == 0
    assert asyncio.current_task().cancelling() == 0  # the cancellation was withdrawn


async def test_a_block_done_in_time_is_left_alone_and_the_timer_stops():
    deadlines = Deadlines(RESOLUTION_S)
    loop = asyncio.get_running_loop()
    async with deadlines.at(loop.time() + 60) as bound:
        await asyncio.sleep(0)
    assert not bound.expired()
    assert deadlines.open_count == 0
    # The timer is armed while a bound is open and goes at the first tick with none open.
    async with deadlines.at(loop.time() + 60):
        assert deadlines._handle is not None
    deadlines._handle.cancel()
    deadlines._tick()
    assert deadlines._handle is None


async def test_a_deadline_already_past_ends_the_block_at_its_first_wait():
    deadlines = Deadlines(RESOLUTION_S)
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with deadlines.at(loop.time() - 1):
            await asyncio.Event().wait()
    assert deadlines.open_count == 0


async def test_a_cancellation_from_elsewhere_stays_a_cancellation():
    deadlines = Deadlines(RESOLUTION_S)
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()

    async def bounded():
        async with deadlines.at(loop.time() + 60):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(bounded())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert deadlines.open_count == 0


async def test_an_outer_cancellation_at_the_deadline_is_not_swallowed():
    """The deadline and a cancellation from elsewhere at once: the task stays cancelled (as
    asyncio.timeout: only a cancellation of its own becomes TimeoutError)."""
    deadlines = Deadlines(RESOLUTION_S)
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()
    bound = deadlines.at(loop.time() + 60)

    async def bounded():
        async with bound:
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(bounded())
    await entered.wait()
    bound.when = loop.time()  # due now: the next tick ends it
    bound._expire()  # the tick's step, in the same turn as the outer cancel
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert bound.expired()


async def test_nested_bounds_the_inner_deadline_raises_inside_the_outer():
    deadlines = Deadlines(RESOLUTION_S)
    loop = asyncio.get_running_loop()
    outer = deadlines.at(loop.time() + 60)
    async with outer:
        with pytest.raises(TimeoutError):
            async with deadlines.at(loop.time() + 0.02):
                await asyncio.Event().wait()
        await asyncio.sleep(0)  # the outer block goes on: its task is not cancelled
    assert not outer.expired()


async def test_a_bound_is_entered_once():
    deadlines = Deadlines(RESOLUTION_S)
    bound = deadlines.at(asyncio.get_running_loop().time() + 60)
    async with bound:
        pass
    with pytest.raises(RuntimeError, match="entered once"):
        async with bound:
            pass
