"""Usage leases: held while the request's process works, gone when it ends or dies."""
import asyncio

import pytest
import redis.asyncio as aioredis
from django.conf import settings

from billing.leases import UsageLease, held_leases, lease_key
from tests.support.billing import sync_redis
from tests.support.waiting import async_wait_until, wait_until


def test_a_lease_is_refreshed_while_held_and_deleted_on_release():
    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        lease = UsageLease(client, settings.REDIS_KEY_PREFIX, "lease-1", ttl_s=1.0)
        try:
            await lease.hold()
            # The time under test: past two TTLs, only refreshes keep it. An unrefreshed control
            # key set now with 2.5 TTLs marks that moment by expiring in Redis.
            control = lease.key + ":control"
            await client.set(control, b"1", px=2500)

            async def control_expired():
                return not await client.exists(control)
            await async_wait_until(control_expired, 30.0, "2.5 lease TTLs passing in Redis")
            alive = await client.exists(lease.key)
            await lease.release()
            return alive, await client.exists(lease.key)
        finally:
            await client.aclose()

    assert asyncio.run(scenario()) == (1, 0)


def test_an_abandoned_lease_expires_and_the_reaper_sees_it_gone():
    async def scenario():
        client = aioredis.Redis.from_url(settings.REDIS_URL)
        lease = UsageLease(client, settings.REDIS_KEY_PREFIX, "lease-2", ttl_s=0.2)
        try:
            await lease.hold()
            lease.abandon()  # the process stops refreshing (as if it died)
        finally:
            await client.aclose()

    asyncio.run(scenario())
    client = sync_redis()
    try:
        assert held_leases(client, settings.REDIS_KEY_PREFIX, ["lease-2", "other"]) == {"lease-2"}
        ttl_ms = client.pttl(lease_key(settings.REDIS_KEY_PREFIX, "lease-2"))
        assert 0 < ttl_ms <= 200
        client.pexpire(lease_key(settings.REDIS_KEY_PREFIX, "lease-2"), 1)
        # Expires within its 1 ms (Redis checks expiry on every access).
        wait_until(lambda: not client.exists(lease_key(settings.REDIS_KEY_PREFIX, "lease-2")),
                   5.0, "the lease expiring", period_s=0.001)
        assert held_leases(client, settings.REDIS_KEY_PREFIX, ["lease-2"]) == set()
    finally:
        client.close()


def test_a_lease_check_fails_loudly_when_redis_is_unreachable():
    import redis

    from scripts.services import free_port

    client = redis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_timeout=0.5,
                                  socket_connect_timeout=0.5)
    with pytest.raises(redis.ConnectionError):
        held_leases(client, "x:", ["a"])  # the reaper's round stops instead of reaping
