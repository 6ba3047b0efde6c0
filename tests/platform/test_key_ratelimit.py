"""django-ratelimit: the per-key request rate on the API and login attempts on the console."""
import json

import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
# Fixed windows an hour long: three requests a few seconds apart never straddle two.
RATE = "2/h"


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_per_key_request_rate(client, auth, ready_replica, settings):
    settings.API_KEY_RATELIMIT = RATE
    statuses = []
    for _ in range(3):
        response = await client.post("/v1/generate", data=json.dumps(BODY),
                                     content_type="application/json", headers=auth)
        statuses.append(response.status_code)
    assert statuses == [200, 200, 429]
    assert response.json()["error"]["code"] == "api_key_rate_exceeded"
    assert int(response["Retry-After"]) >= 1


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_spellings_of_one_key_share_its_count(client, api_key, ready_replica, settings):
    """Keyed on the key's id, not the header's text: another spelling is not a fresh count."""
    settings.API_KEY_RATELIMIT = RATE
    statuses = []
    for authorization in (f"Bearer {api_key}", f"bearer   {api_key}  ", f"BEARER {api_key}"):
        response = await client.post("/v1/generate", data=json.dumps(BODY),
                                     content_type="application/json",
                                     headers={"Authorization": authorization})
        statuses.append(response.status_code)
    assert statuses == [200, 200, 429]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_junk_keys_are_not_counted_as_anyone(client, api_key, ready_replica, settings):
    settings.API_KEY_RATELIMIT = RATE
    for _ in range(3):
        response = await client.post("/v1/generate", data=json.dumps(BODY),
                                     content_type="application/json",
                                     headers={"Authorization": "Bearer llmp_00000000_nope"})
        assert response.status_code == 401
    response = await client.post("/v1/generate", data=json.dumps(BODY),
                                 content_type="application/json",
                                 headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 200


async def _ws_request(api_key: str) -> dict:
    """One request on its own socket; the last message (done or error)."""
    from llm_platform.asgi import application

    communicator = WebsocketCommunicator(application, "/v1/stream")
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    try:
        await communicator.send_to(text_data=json.dumps({**BODY, "api_key": api_key}))
        while True:
            message = await communicator.receive_json_from(timeout=30)
            if message["type"] in {"done", "error"}:
                return message
    finally:
        await communicator.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_websocket_counts_against_the_same_rate(client, api_key, ready_replica,
                                                          settings):
    settings.API_KEY_RATELIMIT = RATE
    response = await client.post("/v1/generate", data=json.dumps(BODY),
                                 content_type="application/json",
                                 headers={"Authorization": f"Bearer {api_key}"})
    assert response.status_code == 200
    assert (await _ws_request(api_key))["type"] == "done"
    refused = await _ws_request(api_key)
    assert refused["type"] == "error" and refused["status"] == 429
    assert refused["error"]["code"] == "api_key_rate_exceeded"
    assert refused["retry_after"] >= 1


def _address_early_in_a_window(rate: str, margin_s: float = 15.0) -> str:
    """django-ratelimit counts in fixed windows (per key, offset by a hash of it): 11 posts that
    straddle a window's end are counted in two windows and the 11th passes. So the test posts
    from a client address whose window has at least `margin_s` left and no attempts yet."""
    from django.contrib import admin
    from django.test import RequestFactory
    from django_ratelimit.core import get_usage

    for last in range(1, 255):
        ip = f"10.9.8.{last}"
        request = RequestFactory().post("/admin/login/", REMOTE_ADDR=ip)
        usage = get_usage(request, fn=admin.site.login, key="ip", rate=rate, method="POST")
        if usage["count"] == 0 and usage["time_left"] >= margin_s:
            return ip
    raise AssertionError(f"no address in 10.9.8.0/24 starts a fresh {rate} window")


@pytest.mark.django_db
def test_console_login_attempts_are_limited(settings):
    console = Client(REMOTE_ADDR=_address_early_in_a_window(settings.LOGIN_RATELIMIT))
    statuses = [console.post("/admin/login/", {"username": "x", "password": "y"}).status_code
                for _ in range(11)]
    assert statuses[:10] == [200] * 10  # the form again, with an error
    assert statuses[10] == 403


def test_every_cache_backend_of_a_process_shares_one_redis_pool():
    """Django makes a cache backend per request context; each used to open its own Redis
    connection (one per API request, django-ratelimit counting in the cache)."""
    from django.core.cache import caches

    backends = [caches.create_connection("default") for _ in range(20)]
    pool = backends[0]._cache._get_connection_pool(True)
    created = len(pool._connections)  # (a blocking pool) earlier tests may have used it
    for i, backend in enumerate(backends):  # a request each, one after the other
        backend.set(f"shared-pool-{i}", i, 5)
        assert backend.get(f"shared-pool-{i}") == i
    pools = {id(backend._cache._get_connection_pool(True)) for backend in backends}
    assert len(pools) == 1
    assert len(pool._connections) - created <= 1  # one connection, reused by all 20


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_requests_refused_before_the_buckets_count_too(client, auth, ready_replica,
                                                             settings):
    """The count rides on the buckets' Lua call; a request refused before it (an unknown
    model) is counted on its own, and over the rate its 429 comes first."""
    settings.API_KEY_RATELIMIT = RATE
    unknown = {**BODY, "model": "no-such-model"}
    statuses = []
    for body in (unknown, BODY, unknown):
        response = await client.post("/v1/generate", data=json.dumps(body),
                                     content_type="application/json", headers=auth)
        statuses.append(response.status_code)
    assert statuses == [404, 200, 429]
    assert response.json()["error"]["code"] == "api_key_rate_exceeded"
