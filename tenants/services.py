"""Writes on tenants and keys (HackSoft style: views and commands call these, never .save())."""
from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from tenants.keys import generate_key, hash_key
from tenants.models import ApiKey, Tenant, TenantMembership, Tier

DEFAULT_TIERS = {
    # name: (priority, ttft_target_ms, tpot_target_ms, requests/min, tokens/min)
    "interactive": (0, 500, 50, 600, 200_000),
    "standard": (10, 1500, 100, 300, 100_000),
    "batch": (20, 60_000, 500, 120, 500_000),
}
# How long each tier's requests may wait in the admission queue (ms) before a 503.
DEFAULT_MAX_QUEUE_WAIT_MS = {"interactive": 2_000, "standard": 5_000, "batch": 30_000}


def ensure_tier(name: str) -> Tier:
    priority, ttft, tpot, rpm, tpm = DEFAULT_TIERS.get(name, DEFAULT_TIERS["standard"])
    tier, _ = Tier.objects.get_or_create(
        name=name,
        defaults={
            "priority": priority,
            "ttft_target_ms": ttft,
            "tpot_target_ms": tpot,
            "requests_per_minute": rpm,
            "tokens_per_minute": tpm,
            "max_queue_wait_ms": DEFAULT_MAX_QUEUE_WAIT_MS.get(name, 5_000),
        },
    )
    return tier


@transaction.atomic
def create_tenant(name: str, tier_name: str = "standard") -> Tenant:
    return Tenant.objects.create(name=name, tier=ensure_tier(tier_name))


@dataclass(frozen=True)
class IssuedKey:
    api_key: ApiKey
    raw_key: str  # shown once to the operator, never stored


def create_api_key(tenant: Tenant, name: str = "") -> IssuedKey:
    raw_key, prefix = generate_key()
    api_key = ApiKey.objects.create(
        tenant=tenant, name=name, prefix=prefix, key_hash=hash_key(raw_key)
    )
    return IssuedKey(api_key=api_key, raw_key=raw_key)


def revoke_api_key(api_key: ApiKey, redis_client=None, key_prefix: str = "") -> ApiKey:
    """Revoke now. With a (sync) Redis client the auth cache entry is dropped at once and every
    API process is told to drop its in-process entry (pub/sub); without one the cached entries
    still expire within settings.API_KEY_CACHE_SECONDS."""
    if api_key.revoked_at is None:
        api_key.revoked_at = timezone.now()
        api_key.save(update_fields=["revoked_at"])
    if redis_client is not None:
        from tenants.auth import cache_key

        from common import redis_keys

        pipe = redis_client.pipeline(transaction=False)
        pipe.delete(cache_key(key_prefix, api_key.key_hash))
        pipe.publish(redis_keys.auth_changes(key_prefix), api_key.key_hash)
        pipe.execute()
    return api_key


def ensure_internal_key(tenant: Tenant) -> ApiKey:
    """The tenant's dashboard-playground key: created on first use, its raw value discarded at
    once (nobody can present it; the dashboard builds its principal from the session)."""
    with transaction.atomic():
        existing = (ApiKey.objects.select_for_update()
                    .filter(tenant=tenant, is_internal=True, revoked_at__isnull=True).first())
        if existing is not None:
            return existing
        raw_key, prefix = generate_key()
        return ApiKey.objects.create(tenant=tenant, name="dashboard playground", prefix=prefix,
                                     key_hash=hash_key(raw_key), is_internal=True)


def add_member(user, tenant: Tenant) -> TenantMembership:
    """Give `user` the tenant's dashboard (a user belongs to one tenant)."""
    membership, _ = TenantMembership.objects.update_or_create(user=user,
                                                              defaults={"tenant": tenant})
    return membership
