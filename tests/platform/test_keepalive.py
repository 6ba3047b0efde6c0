"""KeepAlive.stop() returns promptly even when its cancellation races a refresh completing
(Python 3.11's asyncio.wait_for drops such a cancellation: the chaos benchmark caught a request's
cleanup waiting for the KeepAlive's whole max_s, its usage lease held all along)."""
import asyncio

import pytest

from inference.keepalive import KeepAlive
from tests.support.waiting import async_wait_until

pytestmark = pytest.mark.asyncio


async def test_stop_returns_when_the_cancellation_lands_as_a_refresh_completes():
    started, release = asyncio.Event(), asyncio.get_running_loop().create_future()
    calls = []

    async def refresh():
        calls.append(1)
        started.set()
        await release

    keepalive = KeepAlive(interval_s=0.01, timeout_s=5.0, max_s=600.0)
    keepalive.hold("lease", refresh)
    await asyncio.wait_for(started.wait(), 5)
    runner = keepalive._task
    # The refresh completes in the loop turn in which stop() cancels: set_result runs first,
    # then stop()'s first step.
    asyncio.get_running_loop().call_soon(release.set_result, None)
    await asyncio.wait({asyncio.ensure_future(keepalive.stop())}, timeout=3)
    assert runner.done()
    num_calls = len(calls)
    # Nothing refreshed after stop: the runner is the only caller of refresh, it is done,
    # and no other runner was started.
    assert keepalive._task is None
    assert len(calls) == num_calls


async def test_stop_ends_a_refresh_that_hangs():
    hung = asyncio.Event()

    async def refresh():
        hung.set()
        await asyncio.Event().wait()

    keepalive = KeepAlive(interval_s=0.01, timeout_s=5.0, max_s=600.0)
    keepalive.hold("slot", refresh)
    await asyncio.wait_for(hung.wait(), 5)
    runner = keepalive._task
    await asyncio.wait({asyncio.ensure_future(keepalive.stop())}, timeout=3)
    assert runner.done()


async def test_refreshes_every_interval_until_stopped_and_survives_failures():
    calls = []

    async def refresh():
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("Redis hiccup")

    keepalive = KeepAlive(interval_s=0.01, timeout_s=1.0, max_s=600.0)
    keepalive.hold("idempotency", refresh)
    await async_wait_until(lambda: len(calls) >= 3, 5.0, "three refreshes")
    assert len(calls) >= 3
    await keepalive.stop()
    keepalive.hold("late", refresh)  # after stop: nothing restarts
    num_calls = len(calls)
    assert keepalive._task is None  # no runner, so no refresh can ever come
    assert len(calls) == num_calls
