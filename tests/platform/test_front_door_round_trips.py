"""The front door's cost in round trips, counted in the test (never in production code): every
command or pipeline a Redis connection of this process sends while one request is served, and
every SQL statement. A request that finds its key, tenant and model cached makes at most
`BEFORE_ROUTING` Redis round trips before it is routed (the key's rate and both token buckets
in one Lua call; the admission slot with the usage lease and the pending usage event in one
pipeline) and no database query at all; streaming more tokens costs no more round trips.
Routing costs `ROUTING` (the lease with the prefix index and counters; its snapshot is read on
the admission's round trip when the request is admitted on entry), the
first token one (the prompt's tokens given back; none when the first token is also the last:
the end gives back the whole lease), and the request's whole end one: the router
lease, the routing counters, the admission slot, the token bucket's settlement, the final usage
event and the usage lease's deletion (inference/request_metering.py `end_request`)."""
from __future__ import annotations

import contextvars
import json

import pytest
from django.db.backends.utils import CursorWrapper
from redis.asyncio.connection import AbstractConnection

from common.lean_redis import LeanConnection
from inference.container import current_container
from inference.router import OutstandingTokens
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BEFORE_ROUTING = 2
ROUTING = 1
AT_FIRST_TOKEN = 1
AT_END = 1

_log: contextvars.ContextVar[list | None] = contextvars.ContextVar("round_trips", default=None)


class Counts:
    def __init__(self):
        self.redis: list[str] = []
        self.sql: list[str] = []
        self.at_routing: int | None = None


@pytest.fixture
def counted(monkeypatch):
    """Count Redis sends and SQL statements made in the context `measure` sets (the request's
    task and the tasks it starts; not other requests', not background loops started before)."""
    real_send = AbstractConnection.send_packed_command
    real_lean_send = LeanConnection.send  # plain pipelines (common/lean_redis.py)
    real_execute = CursorWrapper.execute

    async def send(self, command, check_health=True):
        counts = _log.get()
        if counts is not None:
            counts.redis.append(repr(command))
        return await real_send(self, command, check_health)

    def lean_send(self, packed):
        counts = _log.get()
        if counts is not None:
            counts.redis.append(repr(packed))
        return real_lean_send(self, packed)

    def execute(self, sql, params=None):
        counts = _log.get()
        if counts is not None:
            counts.sql.append(sql)
        return real_execute(self, sql, params)

    monkeypatch.setattr(AbstractConnection, "send_packed_command", send)
    monkeypatch.setattr(LeanConnection, "send", lean_send)
    monkeypatch.setattr(CursorWrapper, "execute", execute)
    return None


async def measure(client, auth, body) -> Counts:
    counts = Counts()
    router = current_container().router
    real_acquire = router.acquire

    async def acquire(*args, **kwargs):
        if counts.at_routing is None:
            counts.at_routing = len(counts.redis)
        return await real_acquire(*args, **kwargs)

    router.acquire = acquire
    token = _log.set(counts)
    try:
        response = await client.post("/v1/generate", data=json.dumps(body),
                                     content_type="application/json", headers=auth)
    finally:
        _log.reset(token)
        del router.acquire
    assert response.status_code == 200, response.content
    return counts


async def warm(client, auth) -> None:
    """Key, limits, catalogue, tokenizer and scripts cached. The key's invalidation
    subscription comes up during the first request and clears the in-process key cache as it
    does (what was published before it is unknown), discarding a read running then: the key is
    read once more after it is up, as a process's first requests do."""
    await measure(client, auth, body(2))
    await async_wait_until(lambda: current_container().auth.live, 10,
                           "the API key invalidation subscription is up")
    await measure(client, auth, body(2))


def body(max_tokens: int) -> dict:
    return {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": max_tokens}


async def test_a_cached_request_costs_few_round_trips_and_none_per_token(
        client, auth, ready_replica, counted, settings):
    # Deployment-like caches (the test settings turn them off); the container reads them when
    # this test's event loop first builds it.
    settings.API_KEY_CACHE_SECONDS = settings.QUOTA_LIMITS_CACHE_SECONDS = 30.0
    settings.REGISTRY_CACHE_TTL_SECONDS = 30.0
    await warm(client, auth)
    short = await measure(client, auth, body(2))
    long = await measure(client, auth, body(24))
    assert short.at_routing is not None and short.at_routing <= BEFORE_ROUTING, short.redis
    assert long.at_routing == short.at_routing
    assert len(long.redis) == len(short.redis), (short.redis, long.redis)  # none per token
    assert short.sql == [] and long.sql == [], "\n".join(short.sql)  # none once cached
    assert len(short.redis) <= BEFORE_ROUTING + ROUTING + AT_FIRST_TOKEN + AT_END, short.redis
    # The admission's round trip (the last before routing) carries the routing snapshot; for
    # `balanced` (the default, decided in Redis) without the outstanding tokens, which the
    # lease's round trip reads as it decides.
    admission = short.redis[short.at_routing - 1]
    for part in ("admission:", "route-seq:"):
        assert part in admission, (part, admission[:300])
    assert "outstanding:" not in admission, admission[:300]
    assert "outstanding:" in short.redis[short.at_routing], short.redis[short.at_routing][:300]
    # The last round trip is the whole end: each part's keys are in it.
    end = short.redis[-1]
    for part in ("outstanding:", "routing:", "admission:", "bucket:", "billing:usage",
                 "billing:lease:"):
        assert part in end, (part, end[:300])


async def test_a_one_token_reply_gives_its_lease_back_at_the_end_only(
        client, auth, ready_replica, counted, settings):
    """Its first chunk is the final one: no round trip to give the prompt's tokens back first;
    the end returns the whole lease, and the replica's outstanding tokens are back to zero."""
    settings.API_KEY_CACHE_SECONDS = settings.QUOTA_LIMITS_CACHE_SECONDS = 30.0
    settings.REGISTRY_CACHE_TTL_SECONDS = 30.0
    await warm(client, auth)
    two = await measure(client, auth, body(2))
    one = await measure(client, auth, body(1))
    assert len(one.redis) == len(two.redis) - AT_FIRST_TOKEN, (one.redis, two.redis)
    assert "outstanding:" in one.redis[-1]
    container = current_container()
    outstanding = OutstandingTokens(container.redis, container.key_prefix)
    version, replica = ready_replica.model_version_id, ready_replica.id
    assert await outstanding.read(version, [replica]) == {replica: 0}
