"""Roll-ups carry TTFT percentiles; the dashboard and admin pages read a fixed number of queries
whatever the amount of usage (no per-row queries), measured on a small seeded volume (the
full-size timing is `python -m benchmarks.consoles`)."""
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from benchmarks.consoles import seed_rollups
from billing.models import UsageHourly
from billing.rollups import rollup_usage
from billing.services import write_usage
from tenants.models import Tenant
from tenants.services import create_api_key
from tests.support.billing import event

pytestmark = pytest.mark.django_db(transaction=True)


def test_rollup_computes_ttft_percentiles(tenant_a, model_version):
    key = create_api_key(tenant_a).api_key
    hour = datetime(2026, 3, 2, 10, tzinfo=timezone.utc)
    events = []
    for i, ttft in enumerate([10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0, None]):
        e = event(tenant_a.pk, key.pk, model_version.pk,
                  occurred_at=(hour + timedelta(minutes=i)).timestamp())
        events.append(e.__class__(**{**e.__dict__, "ttft_ms": ttft}))
    write_usage(events)
    rollup_usage(datetime.now(timezone.utc), timedelta(hours=1))
    row = UsageHourly.objects.get()
    assert row.num_requests == 11  # the failed one (no token) counts as a request
    assert row.ttft_p50_ms == pytest.approx(55.0)  # percentile_cont over the 10 with a TTFT
    assert row.ttft_p90_ms == pytest.approx(91.0)


def queries(client, url) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert client.get(url).status_code == 200
    return len(ctx.captured_queries)


def test_page_queries_do_not_grow_with_usage(member_a, tenant_a, tenant_b, manager,
                                             model_version):
    member, staff = Client(), Client()
    member.force_login(member_a)
    staff.force_login(manager)
    now = datetime.now(timezone.utc)
    pages = [(member, "/dashboard/?range=24h"), (member, "/dashboard/?range=365d"),
             (member, "/dashboard/invoices/"), (member, "/dashboard/keys/"),
             (staff, "/admin/tenants/tenant/"), (staff, "/admin/billing/usagehourly/"),
             (staff, "/admin/billing/invoice/")]
    seed_rollups([tenant_a.pk], [model_version], now, num_hours=24)
    small = [queries(c, url) for c, url in pages]
    seed_rollups([tenant_a.pk, tenant_b.pk], [model_version], now - timedelta(days=1),
                 num_hours=24 * 60)
    large = [queries(c, url) for c, url in pages]
    assert small == large
    assert Tenant.objects.count() == 2 and UsageHourly.objects.count() == 24 + 2 * 24 * 60


def test_big_unfiltered_lists_count_with_the_planner_estimate(tenant_a, tenant_b, model_version):
    from billing.admin_paginator import EstimatedCountPaginator

    class Paginator(EstimatedCountPaginator):
        exact_below = 10  # "big" for this test

    seed_rollups([tenant_a.pk, tenant_b.pk], [model_version], datetime.now(timezone.utc), 50)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE billing_usagehourly")
    with CaptureQueriesContext(connection) as ctx:
        assert Paginator(UsageHourly.objects.all(), 100).count == 100  # reltuples after ANALYZE
    assert "reltuples" in ctx.captured_queries[0]["sql"]
    assert "COUNT" not in " ".join(q["sql"].upper() for q in ctx.captured_queries)
    assert Paginator(UsageHourly.objects.filter(tenant=tenant_a), 100).count == 50  # exact
    UsageHourly.objects.filter(tenant=tenant_b).delete()
    assert EstimatedCountPaginator(UsageHourly.objects.all(), 100).count == 50  # small: exact
