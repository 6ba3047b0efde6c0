"""The staff console: roles, live quota consumption, keys shown once, revocation, the fleet page."""
import asyncio
import re
import time

import pytest
import redis.asyncio as aioredis
from django.conf import settings
from django.test import Client

from models_registry.services import register_replica
from tenants.buckets import TokenBuckets
from tenants.keys import hash_key
from tenants.models import ApiKey, Tenant
from tenants.selectors import limits_from_tenant
from tenants.services import create_api_key

pytestmark = pytest.mark.django_db(transaction=True)


def logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_roles_see_what_their_permissions_allow(manager, operator, member_a, model_version):
    as_manager, as_operator = logged_in(manager), logged_in(operator)
    assert as_manager.get("/admin/tenants/tenant/").status_code == 200
    assert as_manager.get("/admin/billing/invoice/").status_code == 200
    assert as_manager.get("/admin/models_registry/replica/").status_code == 200  # view only
    assert as_manager.get("/admin/models_registry/replica/add/").status_code == 403
    assert as_operator.get("/admin/models_registry/replica/add/").status_code == 200
    assert as_operator.get("/admin/tenants/tenant/add/").status_code == 403
    assert as_operator.get("/admin/tenants/apikey/").status_code == 403
    # A tenant member is not staff: every admin page sends them to the admin log-in.
    as_member = logged_in(member_a)
    for url in ("/admin/", "/admin/tenants/tenant/", "/admin/fleet/",
                "/admin/billing/usagerecord/"):
        response = as_member.get(url)
        assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_create_key_shows_it_once_and_stores_only_its_hash(manager, tenant_a):
    client = logged_in(manager)
    page = client.get(f"/admin/tenants/tenant/{tenant_a.pk}/change/")
    assert b"Create API key" in page.content
    response = client.post(f"/admin/tenants/tenant/{tenant_a.pk}/create-key/", {"name": "ci"})
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    key = ApiKey.objects.get(tenant=tenant_a, name="ci")
    raw = re.search(r'id="new-key"[^>]*value="([^"]+)"', response.content.decode()).group(1)
    assert raw.startswith(key.prefix) and key.key_hash == hash_key(raw)
    # Nowhere else: the tenant page and the key's own page never show it again.
    assert raw.encode() not in client.get(f"/admin/tenants/tenant/{tenant_a.pk}/change/").content
    assert raw.encode() not in client.get(f"/admin/tenants/apikey/{key.pk}/change/").content


def test_operator_cannot_create_keys(operator, tenant_a):
    response = logged_in(operator).post(f"/admin/tenants/tenant/{tenant_a.pk}/create-key/")
    assert response.status_code == 403
    assert not ApiKey.objects.exists()


def test_revoke_action(manager, tenant_a):
    key = create_api_key(tenant_a).api_key
    response = logged_in(manager).post("/admin/tenants/apikey/",
                                       {"action": "revoke", "_selected_action": [key.pk]})
    assert response.status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_tenant_list_shows_live_bucket_consumption(manager, tenant_a):
    tenant = Tenant.objects.select_related("tier").get(pk=tenant_a.pk)
    limits = limits_from_tenant(tenant)

    async def spend():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        try:
            # Wall clock, as the platform's buckets use; the page reads them a moment later.
            await TokenBuckets(client, settings.REDIS_KEY_PREFIX, time.time).check(
                limits, limits.token_burst // 2)
        finally:
            await client.aclose()

    asyncio.run(spend())
    page = logged_in(manager).get("/admin/tenants/tenant/").content.decode()
    # Half the tokens bucket spent (a few tokens may have refilled since).
    assert f"/ {limits.token_burst:,} tokens" in page
    assert 'value="50"' in page or 'value="49"' in page


def test_raise_a_limit(manager, tenant_a):
    client = logged_in(manager)
    response = client.post(f"/admin/tenants/tenant/{tenant_a.pk}/change/", {
        "name": "acme", "tier": tenant_a.tier_id, "is_active": "on",
        "tokens_per_minute": "900000", "requests_per_minute": "", "request_burst": "",
        "token_burst": "",
        "api_keys-TOTAL_FORMS": "0", "api_keys-INITIAL_FORMS": "0",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
    })
    assert response.status_code == 302, response.content[:2000]
    tenant_a.refresh_from_db()
    assert tenant_a.tokens_per_minute == 900_000


def test_fleet_page_lists_replicas(operator, model_version):
    replica = register_replica(model_version, "127.0.0.1:9", state="loading")
    page = logged_in(operator).get("/admin/fleet/").content.decode()
    assert f'id="replica-{replica.pk}"' in page and "state-loading" in page
    assert "/static/consoles/fleet.js" in page


def test_migrate_sets_up_the_roles(transactional_db):
    from django.contrib.auth.models import Group
    from django.core.management import call_command

    Group.objects.all().delete()
    call_command("migrate", verbosity=0)
    manager = Group.objects.get(name="account manager")
    operator = Group.objects.get(name="operator")
    assert manager.permissions.filter(codename="add_apikey").exists()
    assert operator.permissions.filter(codename="change_replica").exists()
    assert not operator.permissions.filter(codename="add_apikey").exists()


def test_operator_drains_a_replica_through_the_lifecycle(operator, model_version):
    """The replica list changes states only by actions that go through lifecycle.transition:
    each change is checked and recorded with who made it; an illegal one is refused."""
    from fleet.lifecycle import history
    from models_registry.models import Replica

    ready = register_replica(model_version, "127.0.0.1:11", state="ready")
    stopped = register_replica(model_version, "127.0.0.1:12", state="stopped")
    client = logged_in(operator)
    response = client.post("/admin/models_registry/replica/", {
        "action": "drain", "_selected_action": [ready.pk, stopped.pk]}, follow=True)
    assert response.status_code == 200
    assert Replica.objects.get(pk=ready.pk).state == "draining"
    assert Replica.objects.get(pk=stopped.pk).state == "stopped"  # stopped -> draining refused
    assert history(ready.pk)[-1] == ("ready", "draining",
                                     f"drained by {operator} in the admin")
    page = response.content.decode()
    assert "1 replica(s) drained" in page and "is not allowed" in page
    # The state field itself is not editable on the change form.
    form = client.get(f"/admin/models_registry/replica/{ready.pk}/change/").content.decode()
    assert 'name="state"' not in form
