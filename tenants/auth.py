"""API-key authentication with a short shared cache in Redis.

Invariants: a key revoked in the database stops authenticating within `cache_seconds` (the
cache entry's TTL), or at once when revoked through `tenants.services.revoke_api_key`. A
well-formed key that matches nothing costs one database query, then is refused from Redis for
`negative_seconds` (an entry keyed by its hash, never the key itself): a flood of one bogus key
never reaches PostgreSQL. A new key is random, so no refusal can be cached for it in advance;
a key of a deactivated tenant works again within `negative_seconds` of reactivation.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from django.utils import timezone

from tenants.keys import hash_key, hashes_match, prefix_of
from tenants.models import ApiKey
from common import redis_keys


@dataclass(frozen=True)
class Principal:
    """Who is calling: what the request path needs about the tenant and its key."""

    tenant_id: int
    tenant_name: str
    api_key_id: int
    key_prefix: str
    priority: int
    tier_name: str


class AuthenticationFailed(Exception):
    pass


def cache_key(prefix: str, key_hash: str) -> str:
    return redis_keys.api_key_cache(prefix, key_hash)


def refusal_key(prefix: str, key_hash: str) -> str:
    return redis_keys.api_key_refused(prefix, key_hash)


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def authenticate(raw_key: str | None, redis, key_prefix: str, cache_seconds: float,
                       negative_seconds: float = 60.0) -> Principal:
    """The principal for a presented key, or AuthenticationFailed.

    `redis` is an asyncio Redis client (injected). Misses read PostgreSQL once and cache the
    result for `cache_seconds`; a refusal is cached for `negative_seconds` (0: not cached).
    """
    if not raw_key or prefix_of(raw_key) is None:
        raise AuthenticationFailed("Invalid API key.")
    digest = hash_key(raw_key)
    ckey, rkey = cache_key(key_prefix, digest), refusal_key(key_prefix, digest)
    cached, refused = await redis.mget(ckey, rkey)
    if refused is not None:
        raise AuthenticationFailed("Invalid API key.")
    if cached is not None:
        data = json.loads(cached)
        stored_hash = data.pop("key_hash")
        if hashes_match(stored_hash, raw_key):
            return Principal(**data)
    try:
        principal, stored_hash = await _load_from_database(raw_key)
    except AuthenticationFailed:
        if negative_seconds > 0:
            await redis.set(rkey, b"1", px=max(1, int(negative_seconds * 1000)))
        raise
    payload = {**asdict(principal), "key_hash": stored_hash}
    await redis.set(ckey, json.dumps(payload), px=max(1, int(cache_seconds * 1000)))
    return principal


async def _load_from_database(raw_key: str) -> tuple[Principal, str]:
    prefix = prefix_of(raw_key)
    api_key = (
        await ApiKey.objects.select_related("tenant__tier")
        .filter(prefix=prefix, revoked_at__isnull=True, tenant__is_active=True)
        .afirst()
    )
    # Compare even when nothing was found so the timing does not say whether the prefix exists.
    stored_hash = api_key.key_hash if api_key is not None else "0" * 64
    if not hashes_match(stored_hash, raw_key) or api_key is None:
        raise AuthenticationFailed("Invalid API key.")
    await ApiKey.objects.filter(pk=api_key.pk).aupdate(last_used_at=timezone.now())
    tenant = api_key.tenant
    principal = Principal(
        tenant_id=tenant.pk,
        tenant_name=tenant.name,
        api_key_id=api_key.pk,
        key_prefix=api_key.prefix,
        priority=tenant.tier.priority,
        tier_name=tenant.tier.name,
    )
    return principal, api_key.key_hash
