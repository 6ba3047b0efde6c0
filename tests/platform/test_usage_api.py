"""GET /v1/usage: the authenticated tenant's own roll-ups, never another tenant's."""
from datetime import datetime, timedelta, timezone

import pytest
from asgiref.sync import sync_to_async

from billing.rollups import rollup_usage
from billing.services import write_usage
from tenants.services import create_api_key, create_tenant
from tests.support.billing import event

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

DAY = datetime(2026, 3, 2, tzinfo=timezone.utc)


def seed(tenant, model_version):
    other = create_tenant("other", "standard")
    other_key = create_api_key(other)
    key = create_api_key(tenant).api_key
    events = [event(tenant.pk, key.pk, model_version.pk, input_tokens=100, output_tokens=10,
                    occurred_at=(DAY + timedelta(hours=h, minutes=5)).timestamp())
              for h in (1, 1, 2, 25)]
    events += [event(other.pk, other_key.api_key.pk, model_version.pk, input_tokens=7,
                     output_tokens=7, occurred_at=(DAY + timedelta(hours=1)).timestamp())
               for _ in range(5)]
    write_usage(events)
    rollup_usage(datetime.now(timezone.utc), timedelta(hours=1))
    return {"Authorization": f"Bearer {other_key.raw_key}"}


async def test_own_usage_by_hour_and_day_only(client, auth, tenant, model_version):
    other_auth = await sync_to_async(seed)(tenant, model_version)
    query = {"start": "2026-03-02", "end": "2026-03-04", "granularity": "hour"}
    data = (await client.get("/v1/usage", query, headers=auth)).json()["data"]
    assert [(d["start"], d["num_requests"], d["input_tokens"], d["output_tokens"])
            for d in data] == [
        ("2026-03-02T01:00:00+00:00", 2, 200, 20),
        ("2026-03-02T02:00:00+00:00", 1, 100, 10),
        ("2026-03-03T01:00:00+00:00", 1, 100, 10),
    ]
    days = (await client.get("/v1/usage", {**query, "granularity": "day"}, headers=auth)).json()
    assert [(d["start"][:10], d["num_requests"]) for d in days["data"]] == \
        [("2026-03-02", 3), ("2026-03-03", 1)]
    theirs = (await client.get("/v1/usage", query, headers=other_auth)).json()["data"]
    assert [(d["num_requests"], d["input_tokens"]) for d in theirs] == [(5, 35)]


async def test_bad_requests(client, auth, tenant, model_version):
    ok = {"start": "2026-03-02", "end": "2026-03-03"}
    assert (await client.get("/v1/usage", ok)).status_code == 401
    for bad in ({"end": "2026-03-03"}, {**ok, "granularity": "week"},
                {**ok, "end": "2026-03-01"}, {**ok, "start": "yesterday"},
                {"start": "2020-01-01", "end": "2026-01-01"},
                # Near datetime's limits: converting to UTC overflowed (a 500 schemathesis found).
                {"start": "0004-01-01T00:00:00+17:04", "end": "0004-01-01T00:00:00Z"},
                {"start": "9999-12-31T23:00:00-05:00", "end": "9999-12-31T23:59:59Z"}):
        response = await client.get("/v1/usage", bad, headers=auth)
        assert response.status_code == 400, bad
        assert response.json()["error"]["type"] == "invalid_request_error"
    assert (await client.post("/v1/usage", ok, headers=auth)).status_code == 405
