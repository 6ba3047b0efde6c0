"""Token buckets on the real Redis: refill, waits, corrections, and exactness under concurrent
bursts from several processes (each with its own Redis connection, running the Lua check)."""
import multiprocessing
import uuid
from dataclasses import asdict

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from django.conf import settings

from tenants.buckets import TokenBuckets
from tenants.selectors import Limits
from tests.support.bucket_burst import run_burst

pytestmark = pytest.mark.asyncio


class FakeClock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def limits(tenant_id=None, rpm=60, tpm=600, request_burst=None, token_burst=None) -> Limits:
    return Limits(tenant_id=tenant_id or uuid.uuid4().int % 10**9, tier_name="standard",
                  priority=10, requests_per_minute=rpm, tokens_per_minute=tpm,
                  request_burst=request_burst or rpm, token_burst=token_burst or tpm,
                  max_queue_wait_ms=1000)


@pytest_asyncio.fixture
async def redis():
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    yield client
    await client.aclose()


async def test_burst_then_refill_with_exact_wait(redis):
    clock = FakeClock()
    buckets = TokenBuckets(redis, settings.REDIS_KEY_PREFIX, clock)
    lim = limits(rpm=60, tpm=600, request_burst=2)
    assert (await buckets.check(lim, 100)).admitted
    state = await buckets.check(lim, 100)
    assert state.admitted and state.requests_level == 0 and state.tokens_level == 400
    refused = await buckets.check(lim, 100)
    assert not refused.admitted
    assert refused.wait_ms == 1000 and refused.retry_after_s == 1  # 1 request/s refill
    clock.now += 0.5
    assert (await buckets.check(lim, 100)).wait_ms == 500
    clock.now += 0.5
    assert (await buckets.check(lim, 100)).admitted


async def test_token_wait_and_refill_capped_at_burst(redis):
    clock = FakeClock()
    buckets = TokenBuckets(redis, settings.REDIS_KEY_PREFIX, clock)
    lim = limits(rpm=600, tpm=60, token_burst=100)  # 1 token/s
    assert (await buckets.check(lim, 90)).admitted
    refused = await buckets.check(lim, 40)
    assert not refused.admitted and refused.wait_ms == 30_000 and refused.retry_after_s == 30
    clock.now += 3600
    state = await buckets.check(lim, 0)
    assert state.tokens_level == 100  # never above the burst


async def test_correction_refunds_and_may_go_negative(redis):
    clock = FakeClock()
    buckets = TokenBuckets(redis, settings.REDIS_KEY_PREFIX, clock)
    lim = limits(rpm=600, tpm=60, token_burst=100)
    await buckets.check(lim, 80)  # estimate
    assert await buckets.correct(lim, 30 - 80) == 70  # used 30: refund 50
    assert await buckets.correct(lim, 1000) == -930  # used far more than estimated
    assert await buckets.correct(lim, -10_000) == 100  # a refund never exceeds the burst
    await buckets.correct(lim, 110)  # level -10
    refused = await buckets.check(lim, 5)
    assert not refused.admitted and refused.wait_ms == 15_000  # from -10 up to 5 at 1/s


def _burst_from_processes(lim: Limits, costs_per_process: list[list[int]]) -> list[int]:
    ctx = multiprocessing.get_context("spawn")  # not fork: tests/support/bucket_burst.py
    ready, start, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=run_burst, args=(settings.REDIS_URL, settings.REDIS_KEY_PREFIX,
                                                   asdict(lim), costs, ready, start, results))
             for costs in costs_per_process]
    for proc in procs:
        proc.start()
    for _ in procs:  # every child set up (a spawned one imports Django first): all at once
        ready.get(timeout=60)
    start.set()
    admitted = [results.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    return [cost for batch in admitted for cost in batch]


async def test_four_processes_never_exceed_the_requests_limit():
    # 1 request/min refill: the 20-request burst is all a 4 x 50 burst may get.
    lim = limits(rpm=1, tpm=10**6, request_burst=20)
    admitted = _burst_from_processes(lim, [[1] * 50 for _ in range(4)])
    assert len(admitted) == 20


async def test_four_processes_never_exceed_the_tokens_limit(redis):
    # 1 token/min refill, 1000-token burst, every request costs 7: exactly 142 fit.
    lim = limits(rpm=10**6, tpm=1, token_burst=1000)
    admitted = _burst_from_processes(lim, [[7] * 60 for _ in range(4)])
    assert len(admitted) == 1000 // 7
    level = float(await redis.hget(TokenBuckets(redis, settings.REDIS_KEY_PREFIX,
                                                FakeClock()).keys(lim.tenant_id)[1], "level"))
    assert 1000 - 7 * 142 <= level < 1000 - 7 * 142 + 0.5  # plus the refill of a few seconds


async def test_peek_reads_what_the_lua_refill_would_and_charges_nothing(redis):
    clock = FakeClock()
    buckets = TokenBuckets(redis, settings.REDIS_KEY_PREFIX, clock)
    lim = limits(rpm=60, tpm=600)
    fresh = await buckets.peek(lim)
    assert (fresh.requests_level, fresh.tokens_level) == (60.0, 600.0)  # no bucket yet: full
    charged = await buckets.check(lim, 250)
    assert (charged.requests_level, charged.tokens_level) == (59.0, 350.0)
    clock.now += 1.5  # 1.5 requests and 15 tokens refill
    peeked = await buckets.peek(lim)
    assert (peeked.requests_level, peeked.tokens_level) == (60.0, 365.0)
    assert (await buckets.peek(lim)).tokens_level == 365.0  # a peek charged nothing
    # The Lua check refills the same way: charging 5 now leaves 365 - 5.
    assert (await buckets.check(lim, 5)).tokens_level == 360.0
    await buckets.correct(lim, 400)  # below zero after a correction
    clock.now += 6.0  # + 60 tokens
    assert (await buckets.peek(lim)).tokens_level == -40.0 + 60.0
