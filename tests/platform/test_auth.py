"""API keys: hashed with a visible prefix, cached briefly, revoked within seconds."""

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings

from inference.container import current_container
from tenants.auth import AuthenticationFailed, authenticate, bearer_token, cache_key
from tenants.keys import generate_key, hash_key, prefix_of
from tenants.models import ApiKey
from tenants.services import create_api_key, revoke_api_key
from tests.support.waiting import async_wait_until


def test_key_format_and_storage(tenant):
    issued = create_api_key(tenant)
    stored = ApiKey.objects.get(pk=issued.api_key.pk)
    assert issued.raw_key.startswith(stored.prefix + "_")
    assert stored.key_hash == hash_key(issued.raw_key)
    assert issued.raw_key not in {stored.prefix, stored.key_hash, stored.name}
    assert prefix_of(issued.raw_key) == stored.prefix


def test_prefix_of_rejects_junk():
    raw, prefix = generate_key()
    assert prefix_of(raw) == prefix
    for junk in ["", "llmp", "llmp_x_y", "sk-123", "llmp_12345678_", "other_12345678_abc"]:
        assert prefix_of(junk) is None


def test_bearer_token():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer  abc ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token(None) is None


pytestmark = pytest.mark.django_db(transaction=True)


async def _auth(raw_key: str):
    container = current_container()
    return await authenticate(raw_key, container.redis, container.key_prefix,
                              settings.API_KEY_CACHE_SECONDS, settings.API_KEY_NEGATIVE_CACHE_SECONDS)


@pytest.mark.asyncio
async def test_authenticate_then_cached(tenant, api_key):
    principal = await _auth(api_key)
    assert principal.tenant_id == tenant.pk and principal.tier_name == "interactive"
    key = await ApiKey.objects.aget(tenant=tenant)
    assert key.last_used_at is not None
    # Served from the cache: the row can vanish and the key still works until the TTL.
    await ApiKey.objects.filter(pk=key.pk).aupdate(revoked_at=key.last_used_at)
    assert (await _auth(api_key)).api_key_id == key.pk


async def _gone(redis, key: str) -> bool:
    return not await redis.exists(key)


@pytest.mark.asyncio
async def test_revoked_in_database_stops_within_cache_ttl(tenant, api_key):
    await _auth(api_key)
    key = await ApiKey.objects.aget(tenant=tenant)
    await ApiKey.objects.filter(pk=key.pk).aupdate(revoked_at=key.created_at)
    # The cached principal is a Redis entry whose TTL is at most the cache time: wait for it
    # to expire (the deadline, a hang guard, is well past the TTL).
    container = current_container()
    ckey = cache_key(container.key_prefix, hash_key(api_key))
    ttl_ms = await container.redis.pttl(ckey)
    assert 0 < ttl_ms <= settings.API_KEY_CACHE_SECONDS * 1000
    await async_wait_until(lambda: _gone(container.redis, ckey),
                           settings.API_KEY_CACHE_SECONDS + 5.0, "cached principal expiring")
    with pytest.raises(AuthenticationFailed):
        await _auth(api_key)


@pytest.mark.asyncio
async def test_revoked_through_service_stops_at_once(tenant, api_key):
    import redis as sync_redis

    await _auth(api_key)
    key = await ApiKey.objects.aget(tenant=tenant)
    client = sync_redis.Redis.from_url(settings.REDIS_URL)
    try:
        await sync_to_async(revoke_api_key)(key, client, settings.REDIS_KEY_PREFIX)
    finally:
        client.close()
    with pytest.raises(AuthenticationFailed):
        await _auth(api_key)


@pytest.mark.asyncio
async def test_wrong_secret_with_real_prefix_fails(tenant, api_key):
    forged = api_key[:-4] + ("AAAA" if not api_key.endswith("AAAA") else "BBBB")
    with pytest.raises(AuthenticationFailed):
        await _auth(forged)


class _CountingLoads:
    """Wraps tenants.auth._load_from_database (the only database read of authentication)."""

    def __init__(self, monkeypatch):
        import tenants.auth as auth_module

        self.calls = 0
        real = auth_module._load_from_database

        async def counted(raw_key):
            self.calls += 1
            return await real(raw_key)

        monkeypatch.setattr(auth_module, "_load_from_database", counted)


@pytest.mark.asyncio
async def test_a_bogus_key_costs_one_database_query(monkeypatch, tenant):
    loads = _CountingLoads(monkeypatch)
    bogus = generate_key()[0]  # well formed, matches nothing
    for _ in range(5):
        with pytest.raises(AuthenticationFailed):
            await _auth(bogus)
    assert loads.calls == 1


@pytest.mark.asyncio
async def test_the_refusal_is_stored_under_a_hash_and_expires(tenant):
    bogus = generate_key()[0]
    with pytest.raises(AuthenticationFailed):
        await _auth(bogus)
    container = current_container()
    keys = [key async for key in container.redis.scan_iter(match=f"{container.key_prefix}*")]
    assert not any(bogus.encode() in key for key in keys)
    refusal = f"{container.key_prefix}apikey-refused:{hash_key(bogus)}"
    assert 0 < await container.redis.pttl(refusal) <= settings.API_KEY_NEGATIVE_CACHE_SECONDS * 1000


@pytest.mark.asyncio
async def test_a_revoked_key_is_refused_without_the_database_after_once(monkeypatch, tenant,
                                                                        api_key):
    key = await ApiKey.objects.aget(tenant=tenant)
    await ApiKey.objects.filter(pk=key.pk).aupdate(revoked_at=key.created_at)
    loads = _CountingLoads(monkeypatch)
    for _ in range(3):
        with pytest.raises(AuthenticationFailed):
            await _auth(api_key)
    assert loads.calls == 1


@pytest.mark.asyncio
async def test_no_negative_cache_when_turned_off(monkeypatch, tenant):
    loads = _CountingLoads(monkeypatch)
    bogus = generate_key()[0]
    container = current_container()
    for _ in range(2):
        with pytest.raises(AuthenticationFailed):
            await authenticate(bogus, container.redis, container.key_prefix, 1.0, 0.0)
    assert loads.calls == 2


async def _authenticates(authenticator, raw_key: str) -> bool:
    try:
        await authenticator.authenticate(raw_key)
    except AuthenticationFailed:
        return False
    return True


@pytest.mark.asyncio
async def test_the_process_cache_answers_without_redis_and_drops_a_revoked_key_at_once(
        tenant, api_key, monkeypatch):
    """Each API process keeps a key it authenticated in memory (no round trip); revoking
    through the service reaches every process over pub/sub at once, long before the cache's
    TTL (a minute here)."""
    import redis as sync_redis

    from tenants.auth import KeyAuthenticator

    container = current_container()
    authenticator = KeyAuthenticator(container.redis, container.key_prefix, 60.0, 0.0)
    try:
        await authenticator.authenticate(api_key)  # starts the invalidation listener too

        async def live() -> bool:
            return authenticator.live
        await async_wait_until(live, 10.0, "the invalidation subscription")
        await authenticator.authenticate(api_key)
        # The Redis entry gone and the row revoked behind the cache's back: still served, so
        # from this process's memory.
        key = await ApiKey.objects.aget(tenant=tenant)
        await ApiKey.objects.filter(pk=key.pk).aupdate(revoked_at=key.created_at)
        await container.redis.delete(cache_key(container.key_prefix, hash_key(api_key)))
        assert (await authenticator.authenticate(api_key)).api_key_id == key.pk
        client = sync_redis.Redis.from_url(settings.REDIS_URL)
        try:
            await sync_to_async(revoke_api_key)(key, client, settings.REDIS_KEY_PREFIX)
        finally:
            client.close()

        async def refused() -> bool:
            return not await _authenticates(authenticator, api_key)
        await async_wait_until(refused, 5.0, "the revocation reaching the process cache")
    finally:
        await authenticator.close()


async def _mget_calls(redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_mget", {}).get("calls", 0))


@pytest.mark.asyncio
async def test_a_burst_finding_a_key_absent_reads_it_once(tenant, api_key, monkeypatch):
    """32 requests at once with a key neither the process nor Redis holds (a process just
    started): one Redis read and one database query for all of them, not one each."""
    import asyncio

    from tenants.auth import KeyAuthenticator

    loads = _CountingLoads(monkeypatch)
    container = current_container()
    await container.redis.delete(cache_key(container.key_prefix, hash_key(api_key)))
    authenticator = KeyAuthenticator(container.redis, container.key_prefix, 60.0, 0.0)
    try:
        before = await _mget_calls(container.redis)
        principals = await asyncio.gather(*(authenticator.authenticate(api_key)
                                            for _ in range(32)))
        assert {p.tenant_id for p in principals} == {tenant.pk}
        assert loads.calls == 1
        assert await _mget_calls(container.redis) - before == 1
    finally:
        await authenticator.close()


@pytest.mark.asyncio
async def test_a_reader_that_leaves_hands_the_read_to_the_next_caller(tenant, api_key,
                                                                      monkeypatch):
    import asyncio

    import tenants.auth as auth_module
    from tenants.auth import KeyAuthenticator

    real, started, gate = auth_module._load_from_database, [], asyncio.Event()

    async def held(raw_key):
        started.append(raw_key)
        await gate.wait()
        return await real(raw_key)

    monkeypatch.setattr(auth_module, "_load_from_database", held)
    container = current_container()
    await container.redis.delete(cache_key(container.key_prefix, hash_key(api_key)))
    authenticator = KeyAuthenticator(container.redis, container.key_prefix, 60.0, 0.0)
    try:
        reader = asyncio.ensure_future(authenticator.authenticate(api_key))
        await async_wait_until(lambda: len(started) == 1, 5.0, "the first read")
        waiting = [asyncio.ensure_future(authenticator.authenticate(api_key)) for _ in range(8)]
        await asyncio.sleep(0)
        reader.cancel()  # the client left while its read was in flight
        await async_wait_until(lambda: len(started) == 2, 5.0, "the next caller's read")
        gate.set()
        principals = await asyncio.gather(*waiting)
        assert {p.tenant_id for p in principals} == {tenant.pk} and reader.cancelled()
        assert len(started) == 2  # one read per reader, not one per caller
    finally:
        await authenticator.close()


@pytest.mark.asyncio
async def test_the_database_read_of_a_key_is_given_back_with_the_request(tenant, api_key):
    """The key's database read runs on the request's own ORM thread and marks the request's
    context, so the request's end gives its connection back to the pool (a read in a task of
    its own kept it: a burst of new keys drained the pool in benchmarks.routing)."""
    from asgiref.sync import ThreadSensitiveContext

    from inference import db_connection
    from tenants.auth import KeyAuthenticator

    container = current_container()
    await container.redis.delete(cache_key(container.key_prefix, hash_key(api_key)))
    authenticator = KeyAuthenticator(container.redis, container.key_prefix, 60.0, 0.0)
    try:
        async with ThreadSensitiveContext():  # a request, as inference/views/direct.py runs it
            db_connection._opened.set(False)  # nothing opened by this request yet
            await authenticator.authenticate(api_key)
            assert db_connection._opened.get()  # release_db_connection will give it back
            await db_connection.release_db_connection()
    finally:
        await authenticator.close()


@pytest.mark.asyncio
async def test_a_burst_with_a_bogus_key_is_refused_together(tenant):
    import asyncio

    from tenants.auth import KeyAuthenticator

    container = current_container()
    authenticator = KeyAuthenticator(container.redis, container.key_prefix, 60.0, 0.0)
    bogus = generate_key()[0]
    try:
        results = await asyncio.gather(*(authenticator.authenticate(bogus) for _ in range(8)),
                                       return_exceptions=True)
        assert all(isinstance(r, AuthenticationFailed) for r in results)
        assert not authenticator._reads  # nothing left in flight
    finally:
        await authenticator.close()
