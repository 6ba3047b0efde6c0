"""The error table: status, OpenAI-style body, never a 500 or a hang."""
import json

import pytest
from asgiref.sync import sync_to_async

from models_registry.models import Model, Replica
from models_registry.services import ensure_model_version, register_replica, set_replica_state
from tenants.services import create_api_key, create_tenant
from billing.models import UsageRecord
from tests.support.billing import drain
from inference.container import current_container
from inference.router import OutstandingTokens

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def post(client, body, headers, path="/v1/chat/completions", raw=None):
    data = raw if raw is not None else json.dumps(body)
    return await client.post(path, data=data, content_type="application/json", headers=headers)


def assert_error(response, status, code=None):
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert set(error) >= {"message", "type", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"},
                                     {"Authorization": "Basic abc"},
                                     {"Authorization": "Bearer llmp_00000000_notarealkey"}])
async def test_missing_or_bad_key_is_401(client, model_version, headers):
    assert_error(await post(client, BODY, headers), 401)
    assert_error(await client.get("/v1/models", headers=headers), 401)


async def test_unknown_model_is_404(client, auth, model_version):
    assert_error(await post(client, {**BODY, "model": "nope"}, auth), 404, "model_not_found")


async def test_private_model_without_grant_is_404(client, auth, model_version):
    await Model.objects.filter(name="chat-small").aupdate(is_public=False)
    assert_error(await post(client, BODY, auth), 404)
    assert (await client.get("/v1/models", headers=auth)).json()["data"] == []


@pytest.mark.parametrize("body,param", [
    ({**BODY, "messages": []}, "messages"),
    ({**BODY, "messages": "hello"}, "messages"),
    ({**BODY, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
    ({**BODY, "max_tokens": 0}, "max_tokens"),
    ({**BODY, "max_tokens": "10"}, "max_tokens"),
    ({**BODY, "max_tokens": True}, "max_tokens"),
    ({**BODY, "temperature": "hot"}, "temperature"),
    ({**BODY, "temperature": 3}, "temperature"),
    ({**BODY, "top_p": 0}, "top_p"),
    ({**BODY, "stream": "yes"}, "stream"),
    ({**BODY, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({**BODY, "n": 2}, "n"),
    ({k: v for k, v in BODY.items() if k != "model"}, "model"),
    ({**BODY, "max_tokens": 10_000}, "max_tokens"),  # over the 1024-token context window
])
async def test_invalid_bodies_are_400(client, auth, model_version, body, param):
    error = assert_error(await post(client, body, auth), 400)
    assert error["type"] == "invalid_request_error"
    assert error.get("param") == param


async def test_context_window_counts_the_prompt(client, auth, model_version):
    long_prompt = [{"role": "user", "content": "x" * 1000}]
    error = assert_error(await post(client, {**BODY, "messages": long_prompt}, auth), 400,
                         "context_length_exceeded")
    assert "context window" in error["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe", b""])
async def test_malformed_json_is_400(client, auth, model_version, raw):
    assert_error(await post(client, None, auth, raw=raw), 400)


async def test_body_over_limit_is_413(client, auth, model_version, settings):
    settings.API_MAX_BODY_BYTES = 2000
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 2000
    big = {**BODY, "messages": [{"role": "user", "content": "y" * 5000}]}
    assert_error(await post(client, big, auth), 413, "request_too_large")


async def test_no_ready_replica_is_503_with_retry_after(client, auth, model_version):
    response = await post(client, BODY, auth)
    assert_error(response, 503, "no_replica_available")
    assert int(response["Retry-After"]) >= 1
    stream = await post(client, {**BODY, "stream": True}, auth)
    assert_error(stream, 503)  # decided before the stream starts: a real status, not an event


async def test_draining_replica_gets_no_traffic(client, auth, ready_replica):
    await sync_to_async(set_replica_state)(ready_replica, Replica.State.DRAINING)
    assert_error(await post(client, BODY, auth), 503)


async def test_replica_refusal_is_400(client, auth, ready_replica):
    body = {**BODY, "messages": [{"role": "user", "content": "[invalid]"}]}
    error = assert_error(await post(client, body, auth), 400)
    assert "refuses" in error["message"]


async def test_wrong_method_and_unknown_route(client, auth):
    assert_error(await client.get("/v1/chat/completions", headers=auth), 405)
    assert_error(await client.get("/v1/nothing-here", headers=auth), 404)


async def test_retry_on_another_replica_before_first_token(client, auth, ready_replica,
                                                           fake_replica, model_version):
    # A replica that refuses connections, made to look idle while the good one looks busy,
    # so the router always tries the dead one first; every request still succeeds.
    dead = await sync_to_async(register_replica)(model_version, "127.0.0.1:1")
    container = current_container()
    counter = OutstandingTokens(container.redis, container.key_prefix)
    await counter.add(model_version.pk, ready_replica.pk, 1_000_000)
    for _ in range(3):
        response = await post(client, BODY, auth)
        assert response.status_code == 200, response.content
    assert fake_replica.state.num_requests == 3
    # Every lease was released: counts are back where they started.
    loads = await counter.read(model_version.pk, [ready_replica.pk, dead.pk])
    assert loads == {ready_replica.pk: 1_000_000, dead.pk: 0}
    await sync_to_async(drain)()  # the usage stream -> PostgreSQL
    rows = [r async for r in UsageRecord.objects.all()]
    assert [(r.status, r.replica_id) for r in rows] == [("ok", ready_replica.pk)] * 3


async def test_all_replicas_failing_is_503_not_500(client, auth, model_version, fake_replica,
                                                   ready_replica):
    fake_replica.state.fail_all = True
    response = await post(client, BODY, auth)
    assert_error(response, 503, "replica_error")
    assert "Retry-After" in response


async def test_failure_mid_stream_is_an_error_event(client, auth, ready_replica):
    body = {**BODY, "stream": True, "messages": [{"role": "user", "content": "[die-after-2]"}]}
    response = await post(client, body, auth, path="/v1/generate")
    assert response.status_code == 200
    payload = b"".join([c async for c in response.streaming_content]).decode()
    assert payload.count("event: token") == 2
    assert "event: error" in payload and "replica_error" in payload


async def test_inactive_tenant_is_401(client, auth, tenant, model_version):
    tenant.is_active = False
    await sync_to_async(tenant.save)()
    # Cached principals live API_KEY_CACHE_SECONDS; this key was never used, so no cache.
    assert_error(await post(client, BODY, auth), 401)


async def test_private_model_visible_to_granted_tenant(client, auth, tenant, model_version):
    model = await Model.objects.aget(name="chat-small")
    model.is_public = False
    await sync_to_async(model.save)()
    await sync_to_async(model.tenants.add)(tenant)
    other = await sync_to_async(create_tenant)("other")
    assert [m["id"] for m in (await client.get("/v1/models", headers=auth)).json()["data"]] \
        == ["chat-small"]
    other_key = await sync_to_async(create_api_key)(other)
    other_auth = {"Authorization": f"Bearer {other_key.raw_key}"}
    assert (await client.get("/v1/models", headers=other_auth)).json()["data"] == []
    assert_error(await post(client, BODY, other_auth), 404)
