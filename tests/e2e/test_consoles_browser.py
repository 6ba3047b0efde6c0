"""Browser journeys through the consoles: Playwright driving Debian's Chromium against daphne
(the real ASGI app, Channels over the real Redis), each saving a screenshot under
var/screenshots/. The tenant member's journey runs on a real SmolLM2 replica."""
from __future__ import annotations

import asyncio
import csv
import io
import threading
from datetime import datetime, timedelta, timezone

import httpx
import pytest
from asgiref.sync import sync_to_async
from django.contrib.auth.models import Group, User
from django.db import connections

from billing.invoicing import issue_invoice, month_bounds
from billing.rollups import rollup_usage
from billing.services import set_price, write_usage
from consoles.roles import ACCOUNT_MANAGER, ensure_roles
from fleet.health_check import check_replicas
from models_registry.models import Replica
from models_registry.services import ensure_model_version, register_replica
from tenants.models import ApiKey, Tenant
from tenants.services import add_member, create_api_key, create_tenant, ensure_tier
from tests.e2e.conftest import _start_smollm2
from tests.support.billing import drain, event, priced, reset_usage_stream
from tests.support.browser import chromium, screenshot

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def browser():
    with chromium() as browser:
        yield browser


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900},
                                  accept_downloads=True)
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture(scope="module")
def smollm2():
    proc, server = _start_smollm2()
    try:
        yield server
    finally:
        proc.stop()


def in_thread(fn):
    """Run `fn` on a thread of its own (no Playwright loop there), closing its DB connection."""
    errors = []

    def run():
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(120)
    if errors:
        raise errors[0]


async def health_check() -> None:
    try:
        await check_replicas()
    finally:  # the ORM's worker thread keeps a connection otherwise
        await sync_to_async(connections.close_all)()


def test_account_manager_journey(page, live_server_url, fake_triton):
    """Log in, create a tenant and a key, raise a limit, watch a replica turn ready live."""
    ensure_roles()
    ensure_tier("standard")
    manager = User.objects.create_user("manager", password="manager-pw", is_staff=True)
    manager.groups.add(Group.objects.get(name=ACCOUNT_MANAGER))
    version = ensure_model_version("chat-small", 1, "fake", tokenizer="bytes")
    replica = register_replica(version, fake_triton.grpc_address,
                               metrics_address=fake_triton.metrics_address,
                               state=Replica.State.LOADING)
    base = live_server_url

    page.goto(f"{base}/admin/login/?next=/admin/")
    page.get_by_label("Username").fill("manager")
    page.get_by_label("Password").fill("manager-pw")
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("link", name="Live fleet").wait_for()

    page.goto(f"{base}/admin/tenants/tenant/add/")
    page.locator("#id_name").fill("initech")
    page.locator("#id_tier").select_option(label="standard")
    page.locator("input[name=_continue]").click()
    page.get_by_role("link", name="Create API key").click()
    page.get_by_label("Key name").fill("production")
    page.get_by_role("button", name="Create key").click()
    raw_key = page.get_by_test_id("new-key").input_value()
    tenant = Tenant.objects.get(name="initech")
    assert ApiKey.objects.get(tenant=tenant).prefix in raw_key
    models = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {raw_key}"})
    assert models.status_code == 200  # the key shown once works
    screenshot(page, "manager-key-created")

    page.goto(f"{base}/admin/tenants/tenant/{tenant.pk}/change/")
    page.locator("#id_tokens_per_minute").fill("250000")
    page.locator("input[name=_save]").click()
    page.get_by_text("was changed successfully").wait_for()
    tenant.refresh_from_db()
    assert tenant.tokens_per_minute == 250_000
    assert "250,000 tokens (own)" in page.locator("#result_list").inner_text()
    screenshot(page, "manager-limit-raised")

    page.goto(f"{base}/admin/fleet/")
    page.locator('#fleet-status[data-state="live"]').wait_for()
    state = page.locator(f"#replica-{replica.pk} .state")
    assert state.inner_text() == "loading"
    # The health check finds the replica's server ready; the page changes without a reload.
    url_before = page.url
    page.evaluate("window.__notReloaded = true")
    in_thread(lambda: asyncio.run(health_check()))
    page.wait_for_function(
        f"document.querySelector('#replica-{replica.pk} .state').textContent.trim() === 'ready'")
    assert page.evaluate("window.__notReloaded") is True and page.url == url_before
    screenshot(page, "manager-live-fleet")


def login_member(page, base: str, username: str, password: str) -> None:
    page.goto(f"{base}/dashboard/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("heading", name="Usage and quotas").wait_for()


def test_tenant_member_journey(page, browser, live_server_url, smollm2):
    """Usage chart after real requests, create and revoke a key, download an invoice, and the
    playground streaming SmolLM2's answer into the page; then the phone layout."""
    reset_usage_stream()
    tenant = create_tenant("acme", "interactive")
    member = User.objects.create_user("alice", password="alice-pw")
    add_member(member, tenant)
    version = ensure_model_version("chat-small", 1, smollm2.weights_uri,
                                   tokenizer=smollm2.tokenizer,
                                   context_length=smollm2.context_length)
    register_replica(version, smollm2.grpc_address, metrics_address=smollm2.metrics_address)
    base = live_server_url
    api_key = create_api_key(tenant, "sdk").raw_key
    for prompt in ("Hi", "Name a colour."):
        reply = httpx.post(f"{base}/v1/generate", timeout=120,
                           headers={"Authorization": f"Bearer {api_key}"},
                           json={"model": "chat-small", "max_tokens": 8,
                                 "messages": [{"role": "user", "content": prompt}]})
        assert reply.status_code == 200, reply.text
    drain()  # the usage stream -> PostgreSQL (what the billing consumer does)
    rollup_usage(datetime.now(timezone.utc), timedelta(hours=2))  # what beat does

    # Last month's invoice, issued as the monthly task does.
    start, end = month_bounds(month_bounds(datetime.now(timezone.utc))[0] - timedelta(days=1))
    set_price(version, start, "0.15", "0.6")
    key = ApiKey.objects.get(tenant=tenant, name="sdk")
    write_usage([event(tenant.pk, key.pk, version.pk, input_tokens=2_000_000,
                       output_tokens=500_000, occurred_at=(start + timedelta(days=3)).timestamp())])
    invoice = issue_invoice(tenant.pk, start, end, now=end + timedelta(hours=1))

    login_member(page, base, "alice", "alice-pw")
    page.get_by_role("link", name="Last 24 hours").click()
    page.locator('#chart-tokens path[data-series="chat-small"]').wait_for()
    assert page.get_by_test_id("month-requests").inner_text() == "2"
    screenshot(page, "member-usage")

    page.get_by_role("link", name="API keys").click()
    page.get_by_label("Key name").fill("browser")
    page.get_by_role("button", name="Create key").click()
    new_key = page.get_by_test_id("new-key").input_value()
    created = ApiKey.objects.get(tenant=tenant, name="browser")
    assert new_key.startswith(created.prefix)
    page.get_by_role("button", name=f"Revoke key {created.prefix}").click()
    page.get_by_text(f"Key {created.prefix}… revoked.").wait_for()
    assert "revoked" in page.locator(f"#key-{created.pk}").inner_text()
    assert new_key not in page.content()
    created.refresh_from_db()
    assert created.revoked_at is not None
    screenshot(page, "member-keys")

    page.get_by_role("link", name="Invoices").click()
    page.get_by_role("link", name=start.strftime("%B %Y"), exact=True).click()
    with page.expect_download() as info:
        page.get_by_role("link", name="Download CSV").click()
    rows = list(csv.DictReader(io.StringIO(open(info.value.path()).read())))
    assert rows[0]["tenant"] == "acme" and rows[0]["invoice"] == str(invoice.pk)
    screenshot(page, "member-invoice")

    page.get_by_role("link", name="Playground").click()
    page.get_by_label("Prompt").fill("Say hello in one short sentence.")
    page.get_by_label("Max tokens").fill("16")
    page.get_by_role("button", name="Send").click()
    page.wait_for_function(
        "document.getElementById('pg-status').textContent.startsWith('Done')", timeout=120_000)
    answer = page.locator("#pg-output").inner_text()
    assert answer.strip(), "the playground showed no answer"
    assert "llmp_" not in page.content()  # no API key in the page
    screenshot(page, "member-playground")

    phone = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True,
                                has_touch=True)
    try:
        mobile = phone.new_page()
        login_member(mobile, base, "alice", "alice-pw")
        screenshot(mobile, "member-usage-phone")
        for path in ("/dashboard/", "/dashboard/keys/", "/dashboard/invoices/",
                     "/dashboard/playground/"):
            mobile.goto(base + path)
            width = mobile.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{path} scrolls sideways on a phone ({width} px)"
    finally:
        phone.close()


def test_operator_rolls_back_a_canary(page, live_server_url):
    """Log in as an operator, read the rollout's evidence, roll the canary back."""
    from consoles.roles import OPERATOR
    from models_registry.models import ModelVersion
    from rollouts.models import Rollout
    from rollouts.services import start_rollout

    ensure_roles()
    operator = User.objects.create_user("operator", password="operator-pw", is_staff=True)
    operator.groups.add(Group.objects.get(name=OPERATOR))
    stable = ensure_model_version("chat-small", 1, "fake", tokenizer="bytes")
    canary = priced(ensure_model_version("chat-small", 2, "fake", tokenizer="bytes"))
    rollout = start_rollout(canary, stable=stable, actor="release-bot")
    Rollout.objects.filter(pk=rollout.pk).update(last_evidence={
        "decision": "hold", "canary": {"num_requests": 14, "num_failed": 3},
        "stable": {"num_requests": 120, "num_failed": 0}})
    base = live_server_url

    page.goto(f"{base}/admin/login/?next=/admin/rollouts/rollout/")
    page.get_by_label("Username").fill("operator")
    page.get_by_label("Password").fill("operator-pw")
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("link", name=str(rollout.model.name)).first.click()
    page.get_by_text("num_failed").first.wait_for()
    page.get_by_role("button", name="Roll back").click()
    page.get_by_text("roll back done").wait_for()
    assert page.get_by_role("button", name="Roll back").count() == 0
    rollout.refresh_from_db()
    canary.refresh_from_db()
    assert rollout.state == Rollout.State.ROLLED_BACK
    assert canary.state == ModelVersion.State.RETIRED
    screenshot(page, "operator-canary-rolled-back")
