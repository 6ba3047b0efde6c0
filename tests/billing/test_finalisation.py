"""Pending usage rows: written at admission, finalised exactly once whatever the order."""
from dataclasses import replace

import pytest

from billing.models import UsageRecord
from billing.services import write_usage
from tests.support.billing import event

pytestmark = pytest.mark.django_db(transaction=True)


def pending(final):
    return replace(final, status="pending", input_tokens=0, cached_tokens=0, output_tokens=0,
                   ttft_ms=None, total_ms=0.0, finish_reason="", estimated_tokens=99)


def test_pending_then_final_finalises_the_row(account, model_version):
    tenant, key = account
    final = event(tenant.pk, key.pk, model_version.pk, input_tokens=7, output_tokens=3)
    assert write_usage([pending(final)]) == 1
    row = UsageRecord.objects.get(request_id=final.request_id)
    assert (row.status, row.input_tokens, row.estimated_tokens, row.settled_at) == \
        ("pending", 0, 99, None)
    assert write_usage([final]) == 1
    row.refresh_from_db()
    assert (row.status, row.input_tokens, row.output_tokens) == ("ok", 7, 3)
    assert row.estimated_tokens == 99 and row.settled_at is not None


def test_a_final_row_is_never_changed_again(account, model_version):
    tenant, key = account
    final = event(tenant.pk, key.pk, model_version.pk, input_tokens=7, output_tokens=3)
    write_usage([pending(final)])
    write_usage([final])
    # A late pending event, a redelivered final, a reaper's different final: all no-ops.
    assert write_usage([pending(final)]) == 0
    assert write_usage([final]) == 0
    assert write_usage([replace(final, status="cancelled", output_tokens=1)]) == 0
    row = UsageRecord.objects.get(request_id=final.request_id)
    assert (row.status, row.output_tokens) == ("ok", 3)


def test_final_before_pending_keeps_the_final(account, model_version):
    tenant, key = account
    final = event(tenant.pk, key.pk, model_version.pk, input_tokens=5, output_tokens=2)
    write_usage([final])
    assert write_usage([pending(final)]) == 0
    assert UsageRecord.objects.get(request_id=final.request_id).status == "ok"


def test_one_batch_holding_both_events_writes_the_final(account, model_version):
    tenant, key = account
    final = event(tenant.pk, key.pk, model_version.pk, input_tokens=5, output_tokens=2)
    assert write_usage([pending(final), final, final, pending(final)]) == 1
    row = UsageRecord.objects.get(request_id=final.request_id)
    assert (row.status, row.input_tokens) == ("ok", 5)


def test_pending_rows_are_neither_rolled_up_nor_invoiced(account, model_version):
    from datetime import datetime, timedelta, timezone

    from billing.invoicing import issue_invoices
    from billing.models import UsageHourly
    from billing.rollups import rollup_usage

    tenant, key = account
    final = event(tenant.pk, key.pk, model_version.pk, occurred_at=1_790_000_000.0)
    write_usage([pending(final)])
    now = datetime.fromtimestamp(1_790_000_000.0, tz=timezone.utc) + timedelta(days=40)
    rollup_usage(datetime.now(timezone.utc), timedelta(hours=1))
    assert not UsageHourly.objects.exists()
    assert issue_invoices(now) == []
    write_usage([final])  # finalised later: rolled up and invoiced from then on
    rollup_usage(datetime.now(timezone.utc), timedelta(hours=1))
    assert UsageHourly.objects.get().input_tokens == final.input_tokens
    assert len(issue_invoices(now)) == 1
