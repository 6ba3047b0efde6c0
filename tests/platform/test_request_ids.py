"""Request ids: from the X-Request-Id header to the response, the log lines, the usage row and
the replica (Triton's request id); malformed or reused ids are replaced; error bodies carry it."""
import io
import json
import logging

import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from llm_platform.logging import formatter
from tests.support.billing import drain

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture
def log_lines():
    """Every record, rendered by the platform's JSON formatter, as parsed objects."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter("json"))
    root = logging.getLogger()
    root.addHandler(handler)
    old_level = root.level
    root.setLevel(logging.INFO)
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines() if line]
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


async def post(client, body, headers):
    return await client.post("/v1/generate", data=json.dumps(body),
                             content_type="application/json", headers=headers)


async def test_client_request_id_travels_to_log_usage_row_and_replica(
        client, auth, ready_replica, fake_replica, tenant, log_lines):
    response = await post(client, BODY, {**auth, "X-Request-Id": "trace-abc.123"})
    assert response.status_code == 200, response.content
    assert response["X-Request-Id"] == "trace-abc.123"
    assert response.json()["id"] == "trace-abc.123"
    assert fake_replica.state.requests[-1]["request_id"] == "trace-abc.123"
    await sync_to_async(drain)()
    row = await UsageRecord.objects.aget(request_id="trace-abc.123")
    assert row.tenant_id == tenant.pk
    lines = [line for line in log_lines() if line.get("request_id") == "trace-abc.123"]
    finished = [line for line in lines if line["logger"] == "inference.observability.generation_metrics"]
    assert len(finished) == 1
    line = finished[0]
    assert line["level"] == "info" and line["time"].endswith("Z")
    assert line["tenant_id"] == tenant.pk and line["model"] == "chat-small"
    assert line["output_tokens"] == 2 and line["event"] == "generation ok"


async def test_malformed_or_reused_ids_are_replaced(client, auth, ready_replica):
    first = await post(client, BODY, {**auth, "X-Request-Id": "once-only"})
    again = await post(client, BODY, {**auth, "X-Request-Id": "once-only"})
    bad = await post(client, BODY, {**auth, "X-Request-Id": "has spaces/and slashes"})
    none = await post(client, BODY, auth)
    ids = [r["X-Request-Id"] for r in (first, again, bad, none)]
    assert ids[0] == "once-only"
    assert len(set(ids)) == 4 and all(len(i) == 32 for i in ids[1:])
    assert [r.json()["id"] for r in (first, again, bad, none)] == ids


async def test_error_bodies_carry_the_request_id(client, auth):
    response = await post(client, {"model": "chat-small"}, {**auth, "X-Request-Id": "err-1"})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["request_id"] == "err-1" == response["X-Request-Id"]
    assert error["type"] == "invalid_request_error" and error["param"] == "messages"
    not_found = await client.get("/nowhere")
    assert not_found.json()["error"]["request_id"] == not_found["X-Request-Id"]


async def test_an_unreachable_redis_gives_a_fresh_id_at_once():
    from inference.observability.request_ids import claim

    class HangingRedis:
        async def set(self, *args, **kwargs):
            import asyncio
            await asyncio.Event().wait()  # never answers

    class BrokenRedis:
        async def set(self, *args, **kwargs):
            raise ConnectionError("down")

    for redis in (HangingRedis(), BrokenRedis()):
        request_id, kept = await claim(redis, "p:", "client-id", 60)
        assert not kept and request_id != "client-id" and len(request_id) == 32
