"""Every request gets its final answer within settings.REQUEST_DEADLINE_SECONDS: past it, a
non-streaming request is 504 deadline_exceeded and a stream ends with that error event; either
way its admission slot and outstanding tokens are released at once."""
from __future__ import annotations

import json
import time

import pytest

from inference.container import current_container
from inference.router import OutstandingTokens
from tests.support.platform import sse_events

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

# The fake replica's [slow]: 0.05 s a token, so 400 tokens take 20 s.
SLOW = {"model": "chat-small", "messages": [{"role": "user", "content": "[slow] Hi"}],
        "max_tokens": 400}
DEADLINE_S = 1.0


async def nothing_held(model_version, replica) -> bool:
    container = current_container()
    running = container.admission.keys("chat-small")[1]
    counter = OutstandingTokens(container.redis, container.key_prefix)
    return (await container.redis.zcard(running) == 0
            and await counter.read(model_version.pk, [replica.pk]) == {replica.pk: 0})


async def test_past_the_deadline_is_504_and_releases(settings, client, auth, ready_replica,
                                                     model_version):
    settings.REQUEST_DEADLINE_SECONDS = DEADLINE_S
    started = time.monotonic()
    response = await client.post("/v1/generate", data=json.dumps(SLOW),
                                 content_type="application/json", headers=auth)
    assert time.monotonic() - started < DEADLINE_S + 5
    assert response.status_code == 504, response.content
    assert response.json()["error"]["code"] == "deadline_exceeded"
    assert await nothing_held(model_version, ready_replica)


async def test_a_stream_past_the_deadline_ends_with_the_error_event(settings, client, auth,
                                                                    ready_replica,
                                                                    model_version):
    settings.REQUEST_DEADLINE_SECONDS = DEADLINE_S
    response = await client.post("/v1/generate", data=json.dumps({**SLOW, "stream": True}),
                                 content_type="application/json", headers=auth)
    assert response.status_code == 200
    started = time.monotonic()
    events = sse_events(b"".join([c async for c in response.streaming_content]))
    assert time.monotonic() - started < DEADLINE_S + 5
    assert events[0][0] == "token"
    name, data = events[-1]
    assert name == "error" and data["error"]["code"] == "deadline_exceeded"
    assert await nothing_held(model_version, ready_replica)
