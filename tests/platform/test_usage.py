"""record_usage: the request path's one write; via the stream, one row per request id."""
import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from billing.services import UsageEvent, record_usage
from tests.support.billing import drain

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]


async def test_one_row_per_request_id(tenant, model_version):
    from tenants.models import ApiKey
    from tenants.services import create_api_key

    key = (await sync_to_async(create_api_key)(tenant)).api_key
    event = UsageEvent(request_id="req-1", tenant_id=tenant.pk, api_key_id=key.pk,
                       model_name="chat-small", model_version_id=model_version.pk, replica_id=None,
                       input_tokens=10, cached_tokens=0, output_tokens=5, ttft_ms=12.5,
                       total_ms=40.0, status="ok", finish_reason="stop", endpoint="generate")
    await record_usage(event)
    await record_usage(event)  # a replay writes nothing
    assert await sync_to_async(drain)() == 2
    rows = [r async for r in UsageRecord.objects.all()]
    assert len(rows) == 1
    assert (rows[0].input_tokens, rows[0].output_tokens, rows[0].status) == (10, 5, "ok")
    assert rows[0].occurred_at is not None
    assert await ApiKey.objects.filter(pk=key.pk).aexists()
