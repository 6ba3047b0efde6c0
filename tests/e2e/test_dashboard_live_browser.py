"""The tenant dashboard shows a request made seconds before (no roll-up has run): Playwright
driving Debian's Chromium against daphne, a fake Triton replica serving the request."""
from __future__ import annotations

import httpx
import pytest
from django.contrib.auth.models import User

from models_registry.services import ensure_model_version, register_replica
from tenants.services import add_member, create_api_key, create_tenant
from billing.models import UsageHourly
from tests.e2e.test_consoles_browser import login_member
from tests.support.billing import drain, reset_usage_stream
from tests.support.browser import chromium, screenshot

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_dashboard_shows_a_request_made_seconds_before(live_server_url, fake_triton):
    reset_usage_stream()
    tenant = create_tenant("acme", "interactive")
    add_member(User.objects.create_user("alice", password="alice-pw"), tenant)
    version = ensure_model_version("chat-small", 1, fake_triton.weights_uri,
                                   tokenizer=fake_triton.tokenizer,
                                   context_length=fake_triton.context_length)
    register_replica(version, fake_triton.grpc_address, metrics_address=fake_triton.metrics_address)
    reply = httpx.post(f"{live_server_url}/v1/generate", timeout=60,
                       headers={"Authorization": f"Bearer {create_api_key(tenant).raw_key}"},
                       json={"model": "chat-small", "max_tokens": 3,
                             "messages": [{"role": "user", "content": "Hi"}]})
    assert reply.status_code == 200, reply.text
    drain()  # the usage stream -> PostgreSQL (what the billing consumer does); no roll-up
    assert not UsageHourly.objects.exists()

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(60_000)
        login_member(page, live_server_url, "alice", "alice-pw")
        page.get_by_role("link", name="Last 24 hours").click()
        page.locator('#chart-requests path[data-series="chat-small"]').wait_for()
        assert page.get_by_test_id("month-requests").inner_text() == "1"
        totals = page.get_by_role("table").filter(has_text="Totals for this range")
        assert "chat-small" in totals.inner_text()
        screenshot(page, "member-usage-live")
