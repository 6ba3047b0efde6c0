"""The tenant dashboard: log-in (rate-limited, CSRF), usage charts, quotas, keys, invoices, and
isolation: another tenant's ids answer 404 on every page and endpoint."""
import csv
import io
import re
from datetime import datetime, timedelta, timezone

import pytest
from django.conf import settings
from django.test import Client, override_settings

from billing.invoicing import issue_invoice, month_bounds
from billing.models import Invoice
from billing.rollups import rollup_usage
from billing.services import set_price, write_usage
from tenants.keys import hash_key
from tenants.models import ApiKey
from tenants.services import create_api_key
from tests.support.billing import event
from tests.support.ratelimit import fresh_address

pytestmark = pytest.mark.django_db(transaction=True)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def usage_now(tenant, model_version, num: int, ttft_ms: float = 40.0):
    key = create_api_key(tenant).api_key
    now = datetime.now(timezone.utc) - timedelta(minutes=1)
    events = [event(tenant.pk, key.pk, model_version.pk, input_tokens=100, output_tokens=20,
                    occurred_at=now.timestamp()) for _ in range(num)]
    events = [e.__class__(**{**e.__dict__, "ttft_ms": ttft_ms + i}) for i, e in enumerate(events)]
    write_usage(events)
    rollup_usage(datetime.now(timezone.utc), timedelta(hours=2))


def an_invoice(tenant, model_version) -> Invoice:
    key = create_api_key(tenant).api_key
    start, end = month_bounds(datetime(2026, 3, 5, tzinfo=timezone.utc))
    set_price(model_version, start, "1", "2")
    write_usage([event(tenant.pk, key.pk, model_version.pk, input_tokens=10**6,
                       output_tokens=0, occurred_at=(start + timedelta(days=1)).timestamp())])
    return issue_invoice(tenant.pk, start, end, now=end + timedelta(hours=1))


def test_login_logout_and_csrf(member_a):
    client = Client(enforce_csrf_checks=True)
    page = client.get("/dashboard/login/")
    assert page.status_code == 200 and b'<label for="id_username">' in page.content
    # No CSRF token: refused.
    assert client.post("/dashboard/login/", {"username": "alice", "password": "pw"}
                       ).status_code == 403
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode())[1]
    response = client.post("/dashboard/login/", {"username": "alice", "password": "pw",
                                                 "csrfmiddlewaretoken": token})
    assert response.status_code == 302 and response["Location"] == "/dashboard/"
    # The session cookie expires (settings.SESSION_COOKIE_AGE) and is HttpOnly.
    cookie = client.cookies[settings.SESSION_COOKIE_NAME]
    assert int(cookie["max-age"]) == settings.SESSION_COOKIE_AGE and cookie["httponly"]
    assert client.get("/dashboard/").status_code == 200
    assert client.get("/dashboard/logout/").status_code == 405  # log-out is POST only
    token = client.cookies[settings.CSRF_COOKIE_NAME].value
    client.post("/dashboard/logout/", {"csrfmiddlewaretoken": token})
    assert client.get("/dashboard/").status_code == 302


@override_settings(LOGIN_RATELIMIT="3/h")
def test_login_attempts_are_rate_limited(member_a):
    # From an address with no attempts counted yet (an earlier run's count may still be in its
    # window) and time left in its window (posts straddling two windows are counted in both).
    client = Client(REMOTE_ADDR=fresh_address("3/h", group="dashboard-login",
                                              path="/dashboard/login/"))
    for _ in range(3):
        assert client.post("/dashboard/login/", {"username": "alice", "password": "wrong"}
                           ).status_code == 200
    limited = client.post("/dashboard/login/", {"username": "alice", "password": "pw"})
    assert limited.status_code == 429 and b"Too many log-in attempts" in limited.content
    assert "_auth_user_id" not in client.session  # even the right password is refused


def test_pages_need_a_member(manager):
    assert Client().get("/dashboard/keys/").status_code == 302  # anonymous: to log-in
    response = logged_in(manager).get("/dashboard/")  # staff without a tenant
    assert response.status_code == 403 and b"admin console" in response.content


def test_overview_charts_usage_per_model_and_quotas(member_a, tenant_a, model_version):
    usage_now(tenant_a, model_version, 4)
    page = logged_in(member_a).get("/dashboard/?range=24h").content.decode()
    for chart in ("chart-tokens", "chart-requests", "chart-ttft"):
        assert f'id="{chart}"' in page
    assert 'data-series="chat-small"' in page and 'data-series="chat-small p90"' in page
    assert '<td class="num">4</td><td class="num">480</td>' in page  # 4 requests, 480 tokens
    assert 'id="q-tok"' in page and 'data-testid="month-requests">4<' in page
    for key in ("7d", "30d", "365d", "bogus"):
        assert logged_in(member_a).get(f"/dashboard/?range={key}").status_code == 200


def test_keys_create_once_and_revoke(member_a, tenant_a):
    client = logged_in(member_a)
    response = client.post("/dashboard/keys/", {"name": "staging"})
    assert "no-store" in response["Cache-Control"]
    raw = re.search(r'id="new-key"[^>]*value="([^"]+)"', response.content.decode())[1]
    key = ApiKey.objects.get(tenant=tenant_a, name="staging")
    assert key.key_hash == hash_key(raw)
    assert raw not in client.get("/dashboard/keys/").content.decode()
    response = client.post(f"/dashboard/keys/{key.pk}/revoke/")
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_invoice_view_and_download(member_a, tenant_a, model_version):
    invoice = an_invoice(tenant_a, model_version)
    client = logged_in(member_a)
    assert f"/dashboard/invoices/{invoice.pk}/".encode() in client.get("/dashboard/invoices/").content
    assert b"March 2026" in client.get(f"/dashboard/invoices/{invoice.pk}/").content
    response = client.get(f"/dashboard/invoices/{invoice.pk}/download/")
    assert response["Content-Type"] == "text/csv"
    assert "attachment" in response["Content-Disposition"]
    [line] = csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode()))
    assert line["tenant"] == "acme" and line["num_requests"] == "1"
    assert line["amount"].rstrip("0").rstrip(".") == "1"


def test_isolation_other_tenants_ids_are_404(member_a, tenant_a, member_b, tenant_b,
                                              model_version):
    """Every dashboard page and endpoint that takes an id, tried with the other tenant's."""
    b_key = create_api_key(tenant_b, "bob's").api_key
    b_internal = None
    from tenants.services import ensure_internal_key

    b_internal = ensure_internal_key(tenant_b)
    a_internal = ensure_internal_key(tenant_a)
    b_invoice = an_invoice(tenant_b, model_version)
    usage_now(tenant_b, model_version, 3)
    client = logged_in(member_a)
    for key in (b_key, b_internal, a_internal):  # nor may a member revoke the playground key
        assert client.post(f"/dashboard/keys/{key.pk}/revoke/").status_code == 404
    for url in (f"/dashboard/invoices/{b_invoice.pk}/",
                f"/dashboard/invoices/{b_invoice.pk}/download/"):
        assert client.get(url).status_code == 404
    b_key.refresh_from_db()
    assert b_key.revoked_at is None
    # Nor does anything of B's show on A's pages, whatever the query string says.
    for url in ("/dashboard/", f"/dashboard/?tenant={tenant_b.pk}", "/dashboard/keys/",
                "/dashboard/invoices/", "/dashboard/playground/"):
        page = client.get(url).content.decode()
        assert "globex" not in page and b_key.prefix not in page
        assert f"/dashboard/invoices/{b_invoice.pk}/" not in page
    assert 'id="no-usage"' in client.get("/dashboard/?range=24h").content.decode()
    # B sees its own.
    as_b = logged_in(member_b)
    assert as_b.get(f"/dashboard/invoices/{b_invoice.pk}/").status_code == 200
    assert 'data-series="chat-small"' in as_b.get("/dashboard/?range=24h").content.decode()


def test_an_expired_session_is_logged_out(member_a):
    client = logged_in(member_a)
    assert client.get("/dashboard/").status_code == 200
    session = client.session
    session.set_expiry(-1)  # as if SESSION_COOKIE_AGE had passed since log-in
    session.save()
    response = client.get("/dashboard/")
    assert response.status_code == 302 and response["Location"].startswith("/dashboard/login/")


def test_createmember_command(tenant_a):
    from django.contrib.auth import authenticate
    from django.core.management import call_command

    call_command("createmember", "carol", "acme", "--password", "tidal-owl-quarry-9")
    user = authenticate(username="carol", password="tidal-owl-quarry-9")
    assert user is not None and user.tenant_membership.tenant == tenant_a


@pytest.mark.parametrize("password", ["s3cret", "password123", "12345678901", "qwertyuiop"])
def test_createmember_refuses_weak_passwords(tenant_a, password):
    from django.contrib.auth import get_user_model
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="password refused"):
        call_command("createmember", "carol", "acme", "--password", password)
    assert not get_user_model().objects.filter(username="carol").exists()
