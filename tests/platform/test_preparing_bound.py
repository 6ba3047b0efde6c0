"""inference.faults.preparing: the bound on everything before generation. Past
REQUEST_PREPARE_TIMEOUT_SECONDS it is a 503 (`dependency_timeout`, Retry-After), past the
request's own deadline a 504; the body's own TimeoutError is answered the same way; anything
else the body raises passes unchanged. The bodies wait on events that never come, so the only
thing that ends them is the bound under test."""
from __future__ import annotations

import asyncio

import pytest

from inference.errors import DeadlineExceeded, ServiceUnavailable
from inference.faults import preparing

pytestmark = pytest.mark.asyncio


async def test_a_body_within_the_bound_returns_its_value_untouched(settings):
    settings.REQUEST_PREPARE_TIMEOUT_SECONDS = 30
    loop = asyncio.get_running_loop()
    async with preparing(loop.time() + 60):
        value = await asyncio.sleep(0, "done")
    assert value == "done"


async def test_a_hung_dependency_is_503_before_the_deadline(settings):
    settings.REQUEST_PREPARE_TIMEOUT_SECONDS = 0.01
    settings.DEPENDENCY_RETRY_AFTER_SECONDS = 7
    loop = asyncio.get_running_loop()
    with pytest.raises(ServiceUnavailable) as caught:
        async with preparing(loop.time() + 60):
            await asyncio.Event().wait()
    assert caught.value.code == "dependency_timeout"
    assert caught.value.headers == {"Retry-After": "7"}
    assert caught.value.__suppress_context__


async def test_the_request_deadline_first_is_504(settings):
    settings.REQUEST_PREPARE_TIMEOUT_SECONDS = 30
    loop = asyncio.get_running_loop()
    with pytest.raises(DeadlineExceeded):
        async with preparing(loop.time() + 0.01):
            await asyncio.Event().wait()


async def test_the_bodys_own_timeout_error_is_answered_as_a_timeout(settings):
    settings.REQUEST_PREPARE_TIMEOUT_SECONDS = 30
    loop = asyncio.get_running_loop()
    with pytest.raises(ServiceUnavailable):
        async with preparing(loop.time() + 60):
            raise TimeoutError("a driver's own timeout")


async def test_other_errors_pass_unchanged_and_the_bound_is_gone_after(settings):
    settings.REQUEST_PREPARE_TIMEOUT_SECONDS = 0.01
    loop = asyncio.get_running_loop()
    with pytest.raises(KeyError):
        async with preparing(loop.time() + 60):
            raise KeyError("x")
    # The bound's timer was cancelled with the block: waiting past it is not cancelled.
    done = asyncio.Event()
    loop.call_later(0.05, done.set)
    await done.wait()


async def test_a_cancellation_from_outside_stays_a_cancellation(settings):
    settings.REQUEST_PREPARE_TIMEOUT_SECONDS = 30
    loop = asyncio.get_running_loop()
    entered = asyncio.Event()

    async def body():
        async with preparing(loop.time() + 60):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(body())
    await entered.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
