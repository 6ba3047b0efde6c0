"""Staff see every tenant's usage and invoices in the admin and export them as CSV."""
import csv
import io
from datetime import datetime, timedelta, timezone

import pytest
from django.contrib.auth.models import User
from django.test import Client

from billing.invoicing import issue_invoices
from billing.models import Invoice, UsageRecord
from billing.services import set_price, write_usage
from tests.support.billing import event

pytestmark = pytest.mark.django_db(transaction=True)
MARCH = datetime(2026, 3, 1, tzinfo=timezone.utc)


def body(response) -> str:
    return b"".join(response.streaming_content).decode()


def test_staff_export_usage_and_invoices_as_csv(account, model_version):
    tenant, key = account
    set_price(model_version, MARCH, "1", "2")
    write_usage([event(tenant.pk, key.pk, model_version.pk, input_tokens=10**6, output_tokens=0,
                       occurred_at=(MARCH + timedelta(days=2)).timestamp()) for _ in range(3)])
    issue_invoices(now=MARCH + timedelta(days=32))
    client = Client()
    anonymous = client.get("/admin/billing/usagerecord/")
    assert anonymous.status_code == 302  # to the login page
    User.objects.create_superuser("manager", "m@example.com", "pw")
    client.login(username="manager", password="pw")
    assert client.get("/admin/billing/usagerecord/").status_code == 200
    assert client.get("/admin/billing/invoice/").status_code == 200

    ids = [str(pk) for pk in UsageRecord.objects.values_list("pk", flat=True)]
    response = client.post("/admin/billing/usagerecord/",
                           {"action": "export_csv", "_selected_action": ids})
    rows = list(csv.DictReader(io.StringIO(body(response))))
    assert response["Content-Type"] == "text/csv"
    assert len(rows) == 3 and {r["tenant_id"] for r in rows} == {str(tenant.pk)}

    invoice = Invoice.objects.get()
    response = client.post("/admin/billing/invoice/",
                           {"action": "export_csv", "_selected_action": [str(invoice.pk)]})
    [line] = list(csv.DictReader(io.StringIO(body(response))))
    assert (line["kind"], line["num_requests"]) == ("usage", "3")
    assert line["amount"].rstrip("0").rstrip(".") == "3"
