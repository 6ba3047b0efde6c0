"""Quotas through the API: x-ratelimit headers, 429 + Retry-After, 400 for estimates that can
never fit, corrections with actual usage (finished and cancelled), limits edits seen."""
import asyncio
import json
import time

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from inference.container import current_container
from inference.endpoints import GENERATE
from inference.relay import open_frames
from tenants.buckets import TokenBuckets
from tenants.models import Tenant, Tier
from tenants.selectors import LimitsCache
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
HEADERS = ["x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
           "x-ratelimit-reset-requests", "x-ratelimit-limit-tokens",
           "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"]


async def post(client, body, headers, path="/v1/generate"):
    return await client.post(path, data=json.dumps(body), content_type="application/json",
                             headers=headers)


async def set_limits(tenant, **fields):
    await Tenant.objects.filter(pk=tenant.pk).aupdate(**fields)


async def tokens_level(tenant) -> float:
    redis = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        key = TokenBuckets(redis, settings.REDIS_KEY_PREFIX, lambda: 0.0).keys(tenant.pk)[1]
        return float(await redis.hget(key, "level"))
    finally:
        await redis.aclose()


async def test_headers_on_json_and_streaming_replies(client, auth, tenant, ready_replica):
    # 6 a minute with a burst of 600: one request refills in 10 s, so a slow machine cannot
    # refill one between two replies and blur the counts.
    await Tenant.objects.filter(pk=tenant.pk).aupdate(requests_per_minute=6, request_burst=600)
    response = await post(client, BODY, auth)
    assert response.status_code == 200
    assert all(name in response for name in HEADERS)
    assert response["x-ratelimit-limit-requests"] == "6"
    assert response["x-ratelimit-remaining-requests"] == "599"
    assert response["x-ratelimit-limit-tokens"] == "200000"  # tier interactive
    estimate = 200_000 - int(response["x-ratelimit-remaining-tokens"])
    assert estimate == response.json()["usage"]["input_tokens"] + 4
    assert response["x-ratelimit-reset-requests"] == "10s"  # 1 request at 0.1/s
    stream = await post(client, {**BODY, "stream": True}, auth, "/v1/chat/completions")
    assert stream.status_code == 200 and all(name in stream for name in HEADERS)
    assert stream["x-ratelimit-remaining-requests"] == "598"
    b"".join([chunk async for chunk in stream.streaming_content])


class Clock:
    """The token buckets' injected wall clock, moved by the test."""

    def __init__(self):
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


async def test_429_with_retry_after_then_a_patient_client_succeeds(client, auth, tenant,
                                                                    ready_replica, monkeypatch):
    clock = Clock()  # frozen while the burst is spent: no refill in between
    monkeypatch.setattr(current_container().buckets, "_clock", clock)
    await set_limits(tenant, requests_per_minute=60, request_burst=2)
    assert (await post(client, BODY, auth)).status_code == 200
    assert (await post(client, BODY, auth)).status_code == 200
    refused = await post(client, BODY, auth)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded"
    assert "requests" in error["message"]
    assert refused["Retry-After"] == "1"
    assert refused["x-ratelimit-remaining-requests"] == "0"
    assert all(name in refused for name in HEADERS)
    clock.now += int(refused["Retry-After"])  # the patient client waits what it was told
    assert (await post(client, BODY, auth)).status_code == 200


async def test_tokens_429_retry_after_counts_whole_seconds(client, auth, tenant, ready_replica):
    await set_limits(tenant, tokens_per_minute=600, token_burst=1000)  # 10 tokens/s
    first = await post(client, {**BODY, "max_tokens": 400}, auth)
    assert first.status_code == 200
    num_prompt = first.json()["usage"]["input_tokens"]
    refused = await post(client, {**BODY, "max_tokens": 600}, auth)
    assert refused.status_code == 429 and "tokens" in refused.json()["error"]["message"]
    missing = (num_prompt + 600) - (1000 - num_prompt - 400)  # before the refill meanwhile
    assert int(refused["Retry-After"]) in {-(-missing // 10), -(-missing // 10) - 1}


async def test_estimate_that_can_never_fit_is_400(client, auth, tenant, ready_replica):
    await set_limits(tenant, tokens_per_minute=100)
    response = await post(client, {**BODY, "max_tokens": 200}, auth)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "tokens_exceed_limit" and error["param"] == "max_tokens"
    assert "100 tokens" in error["message"]


async def test_correction_refunds_the_unused_estimate(client, auth, tenant, ready_replica):
    await set_limits(tenant, tokens_per_minute=1, token_burst=10_000)  # no visible refill
    prompt = {**BODY, "messages": [{"role": "user", "content": "[stop] Hi"}], "max_tokens": 50}
    response = await post(client, prompt, auth)
    usage = response.json()["usage"]
    assert usage["output_tokens"] == 3  # estimate charged 50
    expected = 10_000 - (usage["input_tokens"] + 3)

    async def corrected():  # the correction runs as the request ends
        return abs(await tokens_level(tenant) - expected) <= 0.5
    await async_wait_until(corrected, 10.0, "the bucket corrected to the tokens used")
    level = await tokens_level(tenant)
    assert 10_000 - level == pytest.approx(usage["input_tokens"] + 3, abs=0.5)


async def test_cancelled_request_is_charged_what_it_used(auth, tenant, ready_replica,
                                                         fake_replica):
    await set_limits(tenant, tokens_per_minute=1, token_burst=10_000)
    body = {**BODY, "messages": [{"role": "user", "content": "[slow] Hi"}], "max_tokens": 200,
            "stream": True}
    container = current_container()
    principal = await container.preparation.authenticate(auth["Authorization"])
    prepared = await container.preparation.prepare_as(GENERATE, principal, body, None)
    events = await open_frames(container.generation, prepared, GENERATE.response_format)
    assert (await anext(events))[0].name == "token"
    await events.aclose()  # what a client disconnect does to the view's stream
    num_prompt = len(fake_replica.state.requests[0]["input_ids"])
    charged = 10_000 - await tokens_level(tenant)
    assert num_prompt + 0.5 <= charged < num_prompt + 10  # the prompt and the tokens it got


async def test_cancelled_before_the_first_token_is_charged_the_prefill(auth, tenant, ready_replica,
                                                                       fake_replica):
    from asgiref.sync import sync_to_async

    from billing.models import UsageRecord
    from tests.support.billing import drain

    await set_limits(tenant, tokens_per_minute=1, token_burst=10_000)
    body = {**BODY, "messages": [{"role": "user", "content": "[slow-prefill] Hi"}],
            "max_tokens": 200, "stream": True}
    container = current_container()
    principal = await container.preparation.authenticate(auth["Authorization"])
    prepared = await container.preparation.prepare_as(GENERATE, principal, body, None)
    # open_frames waits for the first token (or an error before it).
    first = asyncio.ensure_future(open_frames(container.generation, prepared,
                                                GENERATE.response_format))
    # The replica has the request: it is "prefilling".
    await async_wait_until(lambda: fake_replica.state.usage, 10.0, "the replica prefilling")
    first.cancel()  # the client goes away before the first token
    with pytest.raises(asyncio.CancelledError):
        await first
    num_prompt = len(fake_replica.state.requests[0]["input_ids"])
    # The request's end (ask the replica, correct the bucket, final event) runs shielded after
    # the cancellation: wait for its final event to be billed.
    async def settled():
        await sync_to_async(drain)()
        row = await UsageRecord.objects.aget(request_id=prepared.request_id)
        return row.status != "pending"
    await async_wait_until(settled, 30.0, "the cancelled request's final event billed")
    row = await UsageRecord.objects.aget(request_id=prepared.request_id)
    assert 10_000 - await tokens_level(tenant) == pytest.approx(num_prompt, abs=0.5)
    assert (row.status, row.input_tokens, row.output_tokens, row.ttft_ms) == \
        ("cancelled", num_prompt, 0, None)
    assert row.estimated_tokens == num_prompt + 200 and row.settled_at is not None


async def test_limits_edit_seen_after_the_cache_ttl(tenant):
    redis = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        cache = LimitsCache(redis, settings.REDIS_KEY_PREFIX + "ttl-test:", ttl_seconds=0.3)
        assert (await cache.get(tenant.pk)).requests_per_minute == 600
        await set_limits(tenant, requests_per_minute=7)
        assert (await cache.get(tenant.pk)).requests_per_minute == 600  # still cached
        assert await redis.pttl(cache.key(tenant.pk)) <= 300  # at most the TTL (-2: gone)

        async def expired():
            return not await redis.exists(cache.key(tenant.pk))
        await async_wait_until(expired, 5.0, "the cached limits expiring")
        limits = await cache.get(tenant.pk)
        assert limits.requests_per_minute == 7 and limits.request_burst == 7
    finally:
        await redis.aclose()


async def test_tier_priority_and_tenant_reach_the_replica(client, auth, tenant, ready_replica,
                                                          fake_replica):
    await Tier.objects.filter(name="interactive").aupdate(priority=3)  # an admin edit
    assert (await post(client, BODY, auth)).status_code == 200
    sent = fake_replica.state.requests[-1]
    assert sent["priority"] == 3 and sent["tenant"] == str(tenant.pk)


async def test_headers_on_an_idempotent_replay_which_charges_nothing(client, auth, tenant,
                                                                     ready_replica):
    # 6 a minute: one request refills in 10 s, so a slow machine cannot blur the counts below.
    await Tenant.objects.filter(pk=tenant.pk).aupdate(requests_per_minute=6, request_burst=600)
    first = await post(client, BODY, {**auth, "Idempotency-Key": "replay-1"})
    assert first.status_code == 200 and first["x-ratelimit-remaining-requests"] == "599"
    replay = await post(client, BODY, {**auth, "Idempotency-Key": "replay-1"})
    assert replay.status_code == 200 and all(name in replay for name in HEADERS)
    assert replay["x-ratelimit-remaining-requests"] == "599"  # the replay charged nothing
    assert replay.json() == first.json()
    streamed = {**BODY, "stream": True}
    run = await post(client, streamed, {**auth, "Idempotency-Key": "replay-2"},
                     "/v1/chat/completions")
    b"".join([chunk async for chunk in run.streaming_content])
    assert run["x-ratelimit-remaining-requests"] == "598"
    replay = await post(client, streamed, {**auth, "Idempotency-Key": "replay-2"},
                        "/v1/chat/completions")
    assert replay.status_code == 200 and all(name in replay for name in HEADERS)
    assert replay["x-ratelimit-remaining-requests"] == "598"
    b"".join([chunk async for chunk in replay.streaming_content])


async def test_headers_on_refusals_before_the_bucket_check(client, auth, tenant, ready_replica,
                                                           settings):
    await Tenant.objects.filter(pk=tenant.pk).aupdate(requests_per_minute=6, request_burst=600)
    refusals = [
        (404, {**BODY, "model": "no-such-model"}, auth),
        (400, {**BODY, "max_tokens": -1}, auth),
        (400, {"model": "chat-small"}, auth),
    ]
    for status, body, headers in refusals:
        response = await post(client, body, headers)
        assert response.status_code == status
        assert all(name in response for name in HEADERS), (status, body)
        assert response["x-ratelimit-remaining-requests"] == "600"  # nothing charged
    malformed = await client.post("/v1/generate", data=b"{nope", content_type="application/json",
                                  headers=auth)
    assert malformed.status_code == 400 and all(name in malformed for name in HEADERS)
    await post(client, BODY, {**auth, "Idempotency-Key": "k-422"})
    reused = await post(client, {**BODY, "max_tokens": 5}, {**auth, "Idempotency-Key": "k-422"})
    assert reused.status_code == 422 and all(name in reused for name in HEADERS)
    assert reused["x-ratelimit-remaining-requests"] == "599"  # only the first run charged
    # Not authenticated: no tenant, no buckets to report.
    anonymous = await post(client, BODY, {"Authorization": "Bearer wrong"})
    assert anonymous.status_code == 401 and not any(name in anonymous for name in HEADERS)
    settings.API_MAX_BODY_BYTES = 10
    too_big = await post(client, BODY, auth)
    assert too_big.status_code == 413 and all(name in too_big for name in HEADERS)
