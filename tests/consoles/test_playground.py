"""The playground streams through the platform's own generation path (in-process ASGI, a fake
Triton replica over real gRPC, real PostgreSQL and Redis), authenticated by the session."""
import json

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from billing.models import UsageRecord
from models_registry.services import register_replica
from tenants.models import ApiKey
from tests.platform.conftest import container_cleanup, fake_replica  # noqa: F401 (fixtures)
from tests.support.billing import drain
from tests.support.platform import joined_tokens, sse_events

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]
URL = "/dashboard/playground/stream/"


async def post(client, body):
    return await client.post(URL, data=json.dumps(body), content_type="application/json")


async def test_playground_streams_as_the_members_tenant(member_a, tenant_a, model_version,
                                                        fake_replica):  # noqa: F811
    await sync_to_async(register_replica)(model_version, fake_replica.grpc_address,
                                          metrics_address=fake_replica.metrics_address)
    client = AsyncClient()
    await client.aforce_login(member_a)
    page = await client.get("/dashboard/playground/")
    assert b"<option>chat-small</option>" in page.content
    assert b"llmp_" not in page.content  # no key in the page, ever
    # Ids of other tenants or keys in the body are ignored: the session decides.
    response = await post(client, {"model": "chat-small", "prompt": "Hi", "max_tokens": 3,
                                   "tenant_id": tenant_a.pk + 1000, "api_key": "llmp_x_y"})
    assert response.status_code == 200 and response["Content-Type"] == "text/event-stream"
    events = sse_events(b"".join([c async for c in response.streaming_content]))
    assert [name for name, _ in joined_tokens(events)] == ["token", "done"]
    assert fake_replica.state.requests[0]["priority"] == 0  # the tenant's tier went along
    await sync_to_async(drain)()
    row = await UsageRecord.objects.select_related("api_key").aget()
    assert row.tenant_id == tenant_a.pk and row.api_key.is_internal
    assert await ApiKey.objects.filter(is_internal=True).acount() == 1


async def test_playground_refusals_are_json(member_a, model_version):
    anonymous = await post(AsyncClient(), {"model": "chat-small", "prompt": "Hi"})
    assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "not_logged_in"
    client = AsyncClient()
    await client.aforce_login(member_a)
    for body, param in (({"model": "chat-small", "prompt": ""}, "prompt"),
                        ({"model": "chat-small", "prompt": "Hi", "max_tokens": 10**6},
                         "max_tokens"),
                        ({"prompt": "Hi"}, "model")):
        response = await post(client, body)
        assert response.status_code == 400 and response.json()["error"]["param"] == param
    missing = await post(client, {"model": "nope", "prompt": "Hi"})
    assert missing.status_code == 404
    no_replica = await post(client, {"model": "chat-small", "prompt": "Hi"})
    assert no_replica.status_code == 503 and "Retry-After" in no_replica
    assert (await client.get(URL)).status_code == 405


async def test_playground_needs_the_csrf_token(member_a, model_version):
    client = AsyncClient(enforce_csrf_checks=True)
    await client.aforce_login(member_a)
    assert (await post(client, {"model": "chat-small", "prompt": "Hi"})).status_code == 403
