"""The admission queue through the API: 503 + Retry-After when full or past the tier's wait
bound, a waiting request admitted when a slot frees, /metrics."""
import asyncio
import json

import pytest

from inference.admission import queue_keys
from inference.container import current_container
from inference.endpoints import GENERATE
from inference.relay import open_frames
from tenants.models import Tier
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
SLOW = {**BODY, "messages": [{"role": "user", "content": "[slow] Hi"}], "max_tokens": 400,
        "stream": True}


async def post(client, body, headers):
    return await client.post("/v1/generate", data=json.dumps(body),
                             content_type="application/json", headers=headers)


async def hold_slot(auth):
    """A streaming request that holds the one slot until closed."""
    container = current_container()
    principal = await container.preparation.authenticate(auth["Authorization"])
    prepared = await container.preparation.prepare_as(GENERATE, principal, SLOW, None)
    events = await open_frames(container.generation, prepared, GENERATE.response_format)
    assert (await anext(events))[0].name == "token"
    return events


@pytest.fixture
def one_slot(settings):
    settings.ADMISSION_SLOTS_PER_REPLICA = 1


async def test_503_when_the_queue_is_full(client, auth, ready_replica, one_slot, settings):
    settings.ADMISSION_MAX_QUEUE = 0
    held = await hold_slot(auth)
    response = await post(client, BODY, auth)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "queue_full"
    assert response["Retry-After"] == "2"
    assert "x-ratelimit-remaining-requests" in response
    await held.aclose()
    assert (await post(client, BODY, auth)).status_code == 200


async def test_503_after_the_tier_wait_bound(client, auth, ready_replica, one_slot):
    await Tier.objects.filter(name="interactive").aupdate(max_queue_wait_ms=300)
    held = await hold_slot(auth)
    response = await post(client, BODY, auth)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "queue_timeout"
    assert response["Retry-After"] == "1"
    await held.aclose()


async def test_waiting_request_runs_when_the_slot_frees(client, auth, ready_replica, one_slot):
    held = await hold_slot(auth)
    waiting = asyncio.create_task(post(client, BODY, auth))
    container = current_container()
    queue = queue_keys(container.key_prefix, "chat-small")[0]  # the model's waiting hash

    async def queued():
        return await container.redis.hlen(queue) == 1
    await async_wait_until(queued, 10.0, "the request queued for the held slot")
    assert not waiting.done()
    # The routing snapshot read with its entry is dropped as it starts waiting: no decision of
    # the router stays open while it waits (the router's in-flight decisions stay prunable).
    # Waited for: Redis holds the entry a moment before the request reads the reply.
    await async_wait_until(lambda: container.router._deciding == [], 10.0,
                           "the router with no decision open while the request waits")
    assert not waiting.done()
    metrics = (await client.get("/metrics")).content.decode()
    assert "llmp_admission_queue_depth{" in metrics and "} 1\n" in metrics
    await held.aclose()
    response = await asyncio.wait_for(waiting, 10)
    assert response.status_code == 200
    metrics = (await client.get("/metrics")).content.decode()
    assert "llmp_admission_wait_seconds_count" in metrics
