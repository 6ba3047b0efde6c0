"""Nothing leaks under a burst: several hundred concurrent requests from one tenant against a
daphne with small Redis and PostgreSQL pools (4 and 2 connections) and few admission slots.
Every client gets a final answer (200, or a 4xx/503 JSON refusal; never a 500, never a hang),
and afterwards every admission slot, waiter, outstanding-token count and lease, and pending
Idempotency-Key is back to zero. The fairness benchmark's burst once ran the API's Redis pool
dry (`Too many connections` inside the cleanup), left slots taken with the replica idle and
clients without an answer for minutes."""
from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
import redis as redis_lib
from django.conf import settings

from tenants.models import Tenant
from tenants.services import create_api_key, create_tenant
from tests.e2e.conftest import daphne_server, platform_env, register_chat_small
from tests.support.processes import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

NUM_REQUESTS = 300
NUM_ABANDONED = 20  # clients that go away mid-stream
BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
SLOW = {**BODY, "messages": [{"role": "user", "content": "[slow] Hi"}], "max_tokens": 400,
        "stream": True}


@pytest.fixture
def small_pools(transactional_db):
    prefix = f"{settings.REDIS_KEY_PREFIX}burst-{uuid.uuid4().hex[:4]}:"
    env = platform_env(
        REDIS_KEY_PREFIX=prefix, REDIS_POOL_MAX_SIZE="4", REDIS_POOL_TIMEOUT_SECONDS="10",
        CLEANUP_STEP_TIMEOUT_SECONDS="10", DB_POOL_MAX_SIZE="2", DB_POOL_TIMEOUT_SECONDS="10",
        ADMISSION_SLOTS_PER_REPLICA="4", ADMISSION_HEADROOM_SLOTS_PER_REPLICA="0",
        ADMISSION_MAX_QUEUE="1000", REGISTRY_CACHE_TTL_SECONDS="1",
        API_KEY_RATELIMIT="100000/m", REQUEST_DEADLINE_SECONDS="240")
    with daphne_server("daphne-burst", env) as (url, proc):
        yield url, proc, prefix


def _leftovers(prefix: str, version_id: int) -> dict[str, int]:
    """What is still held in Redis: should all be 0 once every request ended."""
    client = redis_lib.Redis.from_url(settings.REDIS_URL)
    try:
        base = f"{prefix}admission:chat-small"
        outstanding = f"{prefix}outstanding:{version_id}"
        pending = 0
        for key in client.scan_iter(match=f"{prefix}idem:*"):
            raw = client.get(key)
            pending += raw is not None and json.loads(raw)["state"] == "pending"
        return {
            "slots": client.zcard(f"{base}:running"),
            "waiters": client.hlen(f"{base}:waiting"),
            "outstanding_tokens": sum(abs(int(v)) for v in client.hvals(outstanding)),
            "leases": client.zcard(f"{outstanding}:leases"),
            "pending_idempotency_keys": pending,
        }
    finally:
        client.close()


@pytest.mark.parametrize("replica_server", ["fake"], indirect=True)
def test_burst_with_small_pools_answers_everyone_and_leaks_nothing(small_pools, replica_server):
    url, daphne, prefix = small_pools
    tenant = create_tenant(f"burst-{uuid.uuid4().hex[:4]}", "interactive")
    Tenant.objects.filter(pk=tenant.pk).update(
        requests_per_minute=1_000_000, request_burst=100_000, tokens_per_minute=100_000_000,
        token_burst=10_000_000)
    tier = tenant.tier
    tier.max_queue_wait_ms = 180_000
    tier.save()
    version = register_chat_small(replica_server)
    auth = {"Authorization": f"Bearer {create_api_key(tenant).raw_key}"}

    async def one(client: httpx.AsyncClient, n: int):
        headers = {**auth, "Idempotency-Key": f"burst-{n}"}
        body = {**BODY, "stream": n % 3 == 0}
        async with client.stream("POST", url + "/v1/generate", json=body,
                                 headers=headers) as response:
            raw = await response.aread()
        return response.status_code, raw

    async def abandon(client: httpx.AsyncClient):
        async with client.stream("POST", url + "/v1/generate", json=SLOW,
                                 headers=auth) as response:
            async for _ in response.aiter_bytes():
                return response.status_code  # gone after the first bytes

    async def burst():
        limits = httpx.Limits(max_connections=NUM_REQUESTS + NUM_ABANDONED)
        async with httpx.AsyncClient(timeout=240, limits=limits) as client:
            jobs = [one(client, n) for n in range(NUM_REQUESTS)]
            jobs += [abandon(client) for _ in range(NUM_ABANDONED)]
            return await asyncio.gather(*jobs, return_exceptions=True)

    results = asyncio.run(burst())
    answered = results[:NUM_REQUESTS]
    failures = [r for r in answered if isinstance(r, BaseException)]
    assert not failures, failures[:3]  # every client got an answer (no timeout, no reset)
    statuses = sorted({status for status, _ in answered})
    assert all(status in (200, 429, 503) for status in statuses), statuses
    for status, raw in answered:
        if status != 200:
            assert json.loads(raw)["error"]["code"], raw  # a JSON refusal, never a page
    assert sum(status == 200 for status, _ in answered) >= NUM_REQUESTS // 2, statuses
    zero = dict.fromkeys(["slots", "waiters", "outstanding_tokens", "leases",
                          "pending_idempotency_keys"], 0)
    # Releases run as each request ends (a moment after its last byte): wait for them.
    wait_until(lambda: _leftovers(prefix, version.pk) == zero, daphne, 60,
               f"everything released (left: {_leftovers(prefix, version.pk)})")
    assert "Too many connections" not in daphne.log_tail(10**7)
