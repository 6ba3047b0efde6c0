"""Scale to zero: with no replica ready, a request for a version that scales from zero (or has a
replica loading) waits in the admission queue, where the autoscaler sees it, and is served once
the first replica is ready, instead of a 503."""
import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from inference.admission import queue_keys
from inference.container import current_container
from models_registry.models import ScalingPolicy
from models_registry.services import register_replica
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def post(client, headers):
    return await client.post("/v1/generate", data=json.dumps(BODY),
                             content_type="application/json", headers=headers)


async def test_without_scale_to_zero_no_replica_is_a_503(client, auth, model_version):
    response = await post(client, auth)
    assert response.status_code == 503


async def test_a_request_at_zero_waits_for_the_first_replica(client, auth, model_version,
                                                              fake_replica, settings):
    settings.COLD_START_MAX_WAIT_SECONDS = 30
    await ScalingPolicy.objects.acreate(model_version=model_version, min_replicas=0,
                                        scale_to_zero=True)
    request = asyncio.create_task(post(client, auth))
    container = current_container()
    waiting = queue_keys(container.key_prefix, model_version.model.name)[0]  # the model's queue

    async def queued():
        return await container.redis.hlen(waiting) > 0
    # The request is queued (visible to the autoscaler as queue depth).
    await async_wait_until(queued, 10.0, "the request queued for a first replica")
    assert await container.redis.hlen(waiting) == 1
    assert not request.done()
    await sync_to_async(register_replica)(model_version, fake_replica.grpc_address,
                                          metrics_address=fake_replica.metrics_address)
    response = await asyncio.wait_for(request, 30)
    assert response.status_code == 200, response.content
    assert response.json()["usage"]["output_tokens"] > 0
