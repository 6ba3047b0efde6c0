"""Canary rollouts on the request path: the sticky split and the fallback to stable, in-process
against two fake Triton replicas (one per version) over real gRPC, real PostgreSQL and Redis."""
import json

import pytest
import pytest_asyncio
import redis
from asgiref.sync import sync_to_async
from django.conf import settings

from billing.models import UsageRecord
from rollouts import services as rollouts
from inference.fallbacks import FAILED, UNAVAILABLE, fallbacks_key
from inference.canary_split import to_canary
from models_registry.services import ensure_model_version, register_replica
from tests.fakes.triton_server import start_fake
from tests.support.billing import drain
from tests.support.platform import sse_events
from tests.support.billing import priced

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


async def post(client, body, headers, path="/v1/chat/completions"):
    return await client.post(path, data=json.dumps(body), content_type="application/json",
                             headers=headers)


@pytest_asyncio.fixture
async def canary_fake():
    fake = await start_fake()
    yield fake
    await fake.stop()


@pytest.fixture
def canary_version(transactional_db):
    return priced(ensure_model_version("chat-small", 2, "fake", tokenizer="bytes",
                                       context_length=1024, state="staging"))


def conversations(rollout_id: int, tenant_id: int, percent: float, want_canary: bool, n: int):
    """n conversation ids the split sends to the canary (or to stable)."""
    found = []
    i = 0
    while len(found) < n:
        key = f"conv-{i}"
        if to_canary(rollout_id, tenant_id, "conversation:" + key, percent) == want_canary:
            found.append(key)
        i += 1
    return found


def fallback_counts(rollout_id: int) -> dict[str, int]:
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        raw = client.hgetall(fallbacks_key(settings.REDIS_KEY_PREFIX, rollout_id))
    finally:
        client.close()
    counts = {FAILED: 0, UNAVAILABLE: 0}
    for field, value in raw.items():
        counts[field.decode().split(":")[0]] += int(value)
    return counts


async def usage_by_version() -> dict[int, list[str]]:
    await sync_to_async(drain)()
    rows: dict[int, list[str]] = {}
    async for row in UsageRecord.objects.all():
        rows.setdefault(row.model_version_id, []).append(row.status)
    return rows


async def test_split_is_sticky_per_conversation(client, auth, tenant, ready_replica, model_version,
                                                fake_replica, canary_fake, canary_version):
    await sync_to_async(register_replica)(canary_version, canary_fake.grpc_address)
    rollout = await sync_to_async(rollouts.start_rollout)(canary_version, steps=[30, 100])
    to_c = conversations(rollout.pk, tenant.pk, 30, True, 3)
    to_s = conversations(rollout.pk, tenant.pk, 30, False, 3)
    for _ in range(2):  # each conversation lands on the same version every time
        for conv in to_c + to_s:
            response = await post(client, BODY, {**auth, "X-Conversation-Id": conv})
            assert response.status_code == 200, response.content
    assert canary_fake.state.num_requests == 6
    assert fake_replica.state.num_requests == 6
    # Without a conversation id: the conversation's opening is the key; every turn follows it.
    turn1 = {**BODY, "messages": [{"role": "user", "content": "What is a canary?"}]}
    turn2 = {**BODY, "messages": turn1["messages"] + [
        {"role": "assistant", "content": "A bird."}, {"role": "user", "content": "And?"}]}
    before = (canary_fake.state.num_requests, fake_replica.state.num_requests)
    for body in (turn1, turn2, turn1):
        assert (await post(client, body, auth)).status_code == 200
    after = (canary_fake.state.num_requests, fake_replica.state.num_requests)
    assert sorted([after[0] - before[0], after[1] - before[1]]) == [0, 3]
    rows = await usage_by_version()
    assert set(rows[canary_version.pk]) == {"ok"} and set(rows[model_version.pk]) == {"ok"}


async def test_share_of_requests_goes_to_the_canary(client, auth, ready_replica, fake_replica,
                                                    canary_fake, canary_version):
    await sync_to_async(register_replica)(canary_version, canary_fake.grpc_address)
    await sync_to_async(rollouts.start_rollout)(canary_version, steps=[25, 100])
    for i in range(80):
        body = {**BODY, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 1}
        assert (await post(client, body, auth)).status_code == 200
    # 25% of 80 distinct conversations, give or take the hash's spread.
    assert 8 <= canary_fake.state.num_requests <= 32
    assert canary_fake.state.num_requests + fake_replica.state.num_requests == 80


async def test_canary_without_ready_replica_falls_back_to_stable(
        client, auth, tenant, ready_replica, fake_replica, model_version, canary_version):
    rollout = await sync_to_async(rollouts.start_rollout)(canary_version, steps=[50, 100])
    convs = conversations(rollout.pk, tenant.pk, 50, True, 3)
    for conv in convs:
        response = await post(client, BODY, {**auth, "X-Conversation-Id": conv})
        assert response.status_code == 200, response.content
    assert fake_replica.state.num_requests == 3
    assert fallback_counts(rollout.pk) == {FAILED: 0, UNAVAILABLE: 3}
    assert await usage_by_version() == {model_version.pk: ["ok"] * 3}


async def test_failing_canary_never_fails_a_request(client, auth, tenant, ready_replica,
                                                    fake_replica, model_version, canary_version):
    broken = await start_fake(fail_all=True)
    try:
        await sync_to_async(register_replica)(canary_version, broken.grpc_address)
        rollout = await sync_to_async(rollouts.start_rollout)(canary_version, steps=[50, 100])
        convs = conversations(rollout.pk, tenant.pk, 50, True, 4)
        for conv in convs[:2]:
            response = await post(client, BODY, {**auth, "X-Conversation-Id": conv})
            assert response.status_code == 200, response.content
            assert response.json()["choices"][0]["message"]["content"] == " t0 t1 t2"
        for conv in convs[2:]:  # streamed: the client sees only stable's tokens
            response = await post(client, {**BODY, "stream": True},
                                  {**auth, "X-Conversation-Id": conv})
            assert response.status_code == 200
            events = sse_events(b"".join([c async for c in response.streaming_content]))
            assert events[-1][1] == "[DONE]"
            assert not any(isinstance(d, dict) and "error" in d for _, d in events)
        # The first ROUTER_CIRCUIT_FAILURES tried the canary once each; then its replica's
        # circuit is open, so stable serves at once, and that too counts as the canary failing
        # (its replicas fail: not a capacity answer), whatever the order the failures land in.
        failures = settings.ROUTER_CIRCUIT_FAILURES
        assert failures < 4
        assert broken.state.num_requests == failures
        assert fake_replica.state.num_requests == 4
        assert fallback_counts(rollout.pk) == {FAILED: 4, UNAVAILABLE: 0}
        # Billed once each, to the version that served it.
        assert await usage_by_version() == {model_version.pk: ["ok"] * 4}
    finally:
        await broken.stop()


async def test_rollback_sends_everything_to_stable(client, auth, tenant, ready_replica,
                                                   fake_replica, canary_fake, canary_version):
    await sync_to_async(register_replica)(canary_version, canary_fake.grpc_address)
    rollout = await sync_to_async(rollouts.start_rollout)(canary_version, steps=[50, 100])
    convs = conversations(rollout.pk, tenant.pk, 50, True, 3)
    assert (await post(client, BODY, {**auth, "X-Conversation-Id": convs[0]})).status_code == 200
    assert canary_fake.state.num_requests == 1
    await sync_to_async(rollouts.rollback_rollout)(rollout, actor="am")
    for conv in convs:
        assert (await post(client, BODY, {**auth, "X-Conversation-Id": conv})).status_code == 200
    assert canary_fake.state.num_requests == 1 and fake_replica.state.num_requests == 3


async def test_promotion_sends_everything_to_the_canary(client, auth, ready_replica, fake_replica,
                                                        canary_fake, canary_version):
    await sync_to_async(register_replica)(canary_version, canary_fake.grpc_address)
    rollout = await sync_to_async(rollouts.start_rollout)(canary_version, steps=[50, 100])
    await sync_to_async(rollouts.promote_rollout)(rollout, actor="am")
    for i in range(5):
        body = {**BODY, "messages": [{"role": "user", "content": f"q{i}"}]}
        assert (await post(client, body, auth)).status_code == 200
    assert canary_fake.state.num_requests == 5 and fake_replica.state.num_requests == 0


async def test_dead_canary_replica_falls_back_to_stable(client, auth, tenant, ready_replica,
                                                        fake_replica, model_version,
                                                        canary_version):
    from tests.support.processes import free_port

    # Registered ready, but nothing listens there (its server died since the last health check).
    await sync_to_async(register_replica)(canary_version, f"127.0.0.1:{free_port()}")
    rollout = await sync_to_async(rollouts.start_rollout)(canary_version, steps=[50, 100])
    for conv in conversations(rollout.pk, tenant.pk, 50, True, 2):
        response = await post(client, BODY, {**auth, "X-Conversation-Id": conv})
        assert response.status_code == 200, response.content
    assert fallback_counts(rollout.pk) == {FAILED: 2, UNAVAILABLE: 0}
    assert await usage_by_version() == {model_version.pk: ["ok"] * 2}


async def test_canary_whose_tokenizer_cannot_load_falls_back(client, auth, tenant, ready_replica,
                                                             fake_replica, model_version,
                                                             canary_fake):
    # Real-weights tokenizer, but the weights file is missing.
    canary = await sync_to_async(ensure_model_version)(
        "chat-small", 2, "/nonexistent/weights.gguf", context_length=1024, state="staging")
    await sync_to_async(register_replica)(canary, canary_fake.grpc_address)
    rollout = await sync_to_async(rollouts.start_rollout)(await sync_to_async(priced)(canary),
                                                          steps=[50, 100])
    for conv in conversations(rollout.pk, tenant.pk, 50, True, 2):
        response = await post(client, BODY, {**auth, "X-Conversation-Id": conv})
        assert response.status_code == 200, response.content
    assert canary_fake.state.num_requests == 0 and fake_replica.state.num_requests == 2
    assert fallback_counts(rollout.pk) == {FAILED: 2, UNAVAILABLE: 0}
