"""Redis hung or down answers 503 with Retry-After within a few seconds (never a 500, never a
hang), and service comes back by itself when Redis does: a private redis-server that the test
stops with SIGSTOP, resumes with SIGCONT, kills and restarts on its port. In-process API
(Django's ASGI handler) with the fake replica over real gRPC and the real PostgreSQL."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from channels.testing import WebsocketCommunicator

from inference.consumers import CLOSE_SERVER_ERROR, StreamConsumer
from tests.support.private_redis import PrivateRedis

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
SOCKET_TIMEOUT_S = 1.0
# A hung Redis costs at most a few socket timeouts per request (auth, then the error path).
ANSWER_WITHIN_S = 8 * SOCKET_TIMEOUT_S


@pytest_asyncio.fixture
async def private_redis(settings):
    server = PrivateRedis().start()
    settings.REDIS_URL = server.url
    settings.REDIS_SOCKET_TIMEOUT_SECONDS = SOCKET_TIMEOUT_S
    settings.REDIS_CONNECT_TIMEOUT_SECONDS = SOCKET_TIMEOUT_S
    settings.API_KEY_RATELIMIT = ""  # django-ratelimit counts in the shared cache, not here
    try:
        yield server
    finally:
        server.stop()


async def post(client, auth):
    return await client.post("/v1/generate", data=json.dumps(BODY),
                             content_type="application/json", headers=auth)


async def timed_post(client, auth):
    started = time.monotonic()
    response = await asyncio.wait_for(post(client, auth), 60)
    return response, time.monotonic() - started


async def until_ok(client, auth, within_s: float):
    """Recovery: the first 200 after the fault, within `within_s` (retrying like a client)."""
    end = time.monotonic() + within_s
    while True:
        response = await post(client, auth)
        if response.status_code == 200 or time.monotonic() > end:
            return response
        assert response.status_code == 503, response.content
        await asyncio.sleep(0.2)  # a client's retry


def assert_unavailable(response, elapsed_s):
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "redis_unavailable"
    assert int(response["Retry-After"]) >= 1
    assert elapsed_s < ANSWER_WITHIN_S


async def admission_idle(url: str) -> bool:
    """No slot held, nobody waiting, no outstanding tokens in the private Redis."""
    client = aioredis.Redis.from_url(url)
    try:
        for key in await client.keys("*admission:*:running"):
            assert await client.zcard(key) == 0, key
        for key in await client.keys("*admission:*:waiting"):
            assert await client.hlen(key) == 0, key
        for key in await client.keys("*outstanding:*"):
            if await client.type(key) == b"hash" and not key.endswith(b":held"):
                assert all(int(v) == 0 for v in (await client.hgetall(key)).values()), key
        return True
    finally:
        await client.aclose()


async def test_hung_redis_is_503_within_the_timeout_and_recovers(private_redis, client, auth,
                                                                 ready_replica):
    assert (await post(client, auth)).status_code == 200
    private_redis.pause()
    try:
        for _ in range(2):  # also with the pool's connections timed out once already
            response, elapsed = await timed_post(client, auth)
            assert_unavailable(response, elapsed)
    finally:
        private_redis.resume()
    assert (await until_ok(client, auth, 15)).status_code == 200
    assert await admission_idle(private_redis.url)


async def test_redis_down_is_503_and_service_returns_with_it(private_redis, client, auth,
                                                            ready_replica):
    assert (await post(client, auth)).status_code == 200
    private_redis.stop()
    response, elapsed = await timed_post(client, auth)
    assert_unavailable(response, elapsed)
    private_redis.start()  # same port, empty: the platform reconnects by itself
    assert (await until_ok(client, auth, 15)).status_code == 200


async def test_redis_hung_mid_stream_ends_the_stream_with_an_error_event(
        private_redis, client, auth, ready_replica):
    """Hung after the first token: the stream still ends (token events, then a final event),
    within the bound; the slot and lease come back when Redis does."""
    body = {**BODY, "stream": True, "max_tokens": 40,
            "messages": [{"role": "user", "content": "[slow] Hi"}]}
    response = await client.post("/v1/generate", data=json.dumps(body),
                                 content_type="application/json", headers=auth)
    assert response.status_code == 200
    chunks = response.streaming_content
    first = await anext(chunks)
    assert b"token" in first
    private_redis.pause()
    try:
        started = time.monotonic()
        rest = b"".join([c async for c in chunks])
        assert time.monotonic() - started < 30
    finally:
        private_redis.resume()
    assert b"event: done" in rest or b"event: error" in rest
    assert (await until_ok(client, auth, 15)).status_code == 200


async def test_websocket_gets_an_error_frame_and_a_close_when_redis_hangs(private_redis, auth,
                                                                        ready_replica):
    communicator = WebsocketCommunicator(
        StreamConsumer.as_asgi(), "/v1/stream",
        headers=[(b"authorization", auth["Authorization"].encode())])
    connected, _ = await communicator.connect()
    assert connected
    private_redis.pause()
    try:
        await communicator.send_to(text_data=json.dumps(BODY))
        frame = json.loads(await communicator.receive_from(timeout=ANSWER_WITHIN_S))
        assert frame["type"] == "error" and frame["status"] == 503, frame
        assert frame["error"]["code"] == "redis_unavailable"
        closed = await communicator.receive_output(timeout=5)
        assert closed == {"type": "websocket.close", "code": CLOSE_SERVER_ERROR}
    finally:
        private_redis.resume()
        await communicator.disconnect()


async def test_idle_unauthenticated_websocket_is_closed(settings, transactional_db):
    settings.WEBSOCKET_AUTH_TIMEOUT_SECONDS = 0.3
    communicator = WebsocketCommunicator(StreamConsumer.as_asgi(), "/v1/stream")
    connected, _ = await communicator.connect()
    assert connected
    frame = json.loads(await communicator.receive_from(timeout=10))
    assert frame["status"] == 401 and frame["error"]["code"] == "authentication_timeout"
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close",
                                                            "code": 4401}
    await communicator.disconnect()
