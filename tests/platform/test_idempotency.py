"""Idempotency-Key: tenant-scoped; replay, 422 on another body, 409 while in flight."""
import asyncio
import json

import pytest
from asgiref.sync import sync_to_async

from billing.models import UsageRecord
from tenants.services import create_api_key, create_tenant
from tests.support.billing import drain
from tests.support.platform import joined_tokens, sse_events

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def post(client, body, headers, path="/v1/generate"):
    return await client.post(path, data=json.dumps(body), content_type="application/json",
                             headers=headers)


async def test_same_key_same_body_replays_without_generating(client, auth, ready_replica,
                                                             fake_replica):
    headers = {**auth, "Idempotency-Key": "order-1"}
    first = (await post(client, BODY, headers)).json()
    # Key order and whitespace do not make a different body.
    reordered = dict(reversed(list(BODY.items())))
    second = (await post(client, reordered, headers)).json()
    assert second == first
    assert fake_replica.state.num_requests == 1
    await sync_to_async(drain)()  # the usage stream -> PostgreSQL
    assert await UsageRecord.objects.acount() == 1


async def test_stream_replay_has_the_same_events(client, auth, ready_replica, fake_replica):
    headers = {**auth, "Idempotency-Key": "stream-1"}
    body = {**BODY, "stream": True}
    first = b"".join([c async for c in (await post(client, body, headers)).streaming_content])
    second = b"".join([c async for c in (await post(client, body, headers)).streaming_content])
    # The same content and end; token boundaries are the relay's (tokens that arrived together).
    assert joined_tokens(sse_events(first)) == joined_tokens(sse_events(second))
    assert fake_replica.state.num_requests == 1


async def test_different_body_is_422(client, auth, ready_replica):
    headers = {**auth, "Idempotency-Key": "k"}
    assert (await post(client, BODY, headers)).status_code == 200
    response = await post(client, {**BODY, "max_tokens": 5}, headers)
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    # Another endpoint with the same body is another request too.
    assert (await post(client, BODY, headers, "/v1/chat/completions")).status_code == 422


async def test_duplicate_in_flight_is_409(client, auth, ready_replica, fake_replica):
    headers = {**auth, "Idempotency-Key": "slow-1"}
    body = {**BODY, "max_tokens": 40, "messages": [{"role": "user", "content": "[slow]"}]}
    first = asyncio.create_task(post(client, body, headers))
    # The first request holds the key once it streams from the replica (2 s of [slow] tokens).
    await asyncio.wait_for(fake_replica.state.arrived.wait(), 60)
    response = await post(client, body, headers)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_in_use"
    assert (await first).status_code == 200
    assert (await post(client, body, headers)).status_code == 200  # now a replay


async def test_keys_are_scoped_to_the_tenant(client, auth, ready_replica, fake_replica):
    other = await sync_to_async(create_tenant)("other")
    other_key = (await sync_to_async(create_api_key)(other)).raw_key
    await post(client, BODY, {**auth, "Idempotency-Key": "shared"})
    response = await post(client, {**BODY, "max_tokens": 2},
                          {"Authorization": f"Bearer {other_key}", "Idempotency-Key": "shared"})
    assert response.status_code == 200
    assert response.json()["usage"]["output_tokens"] == 2
    assert fake_replica.state.num_requests == 2


async def test_failed_request_releases_the_key(client, auth, model_version, fake_replica,
                                               ready_replica):
    headers = {**auth, "Idempotency-Key": "retry-me"}
    fake_replica.state.fail_all = True
    assert (await post(client, BODY, headers)).status_code == 503
    fake_replica.state.fail_all = False
    response = await post(client, BODY, headers)
    assert response.status_code == 200
    assert response.json()["text"] == " t0 t1 t2 t3"


async def test_bad_key_header_is_400(client, auth, model_version):
    response = await post(client, BODY, {**auth, "Idempotency-Key": "x" * 300})
    assert response.status_code == 400


def _store():
    from django.conf import settings

    from inference.container import current_container
    from inference.idempotency import IdempotencyStore

    container = current_container()
    return IdempotencyStore(container.redis, container.key_prefix, settings.IDEMPOTENCY_TTL_SECONDS,
                            settings.IDEMPOTENCY_PENDING_TTL_SECONDS)


async def test_only_the_owner_completes_its_claim():
    from dataclasses import replace

    from inference.idempotency import Claim, Replay

    store = _store()
    claim = await store.begin(7, "owner-check", "fp")
    assert isinstance(claim, Claim)
    forged = replace(claim, owner="someone-else")
    assert not await store.complete(forged, {"text": "forged"})
    assert await store.complete(claim, {"text": "real"})
    replay = await store.begin(7, "owner-check", "fp")
    assert isinstance(replay, Replay) and replay.result == {"text": "real"}
    assert not await store.complete(claim, {"text": "again"})  # done already: not pending


async def test_a_request_that_outlived_its_claim_does_not_overwrite_the_next():
    from inference.idempotency import Claim, Replay

    store = _store()
    slow = await store.begin(7, "outlived", "fp")
    await store._redis.delete(slow.redis_key)  # its pending entry expired
    current = await store.begin(7, "outlived", "fp")
    assert isinstance(current, Claim) and current.owner != slow.owner
    assert not await store.complete(slow, {"text": "late"})
    assert await store.complete(current, {"text": "current"})
    replay = await store.begin(7, "outlived", "fp")
    assert isinstance(replay, Replay) and replay.result == {"text": "current"}


# --- takeover of a dead process's pending key (inference/process_lease.py) -------------------

def _store_of(process):
    from django.conf import settings

    from inference.container import current_container
    from inference.idempotency import IdempotencyStore

    container = current_container()
    return IdempotencyStore(container.redis, container.key_prefix, settings.IDEMPOTENCY_TTL_SECONDS,
                            settings.IDEMPOTENCY_PENDING_TTL_SECONDS, process=process)


def _process():
    from inference.container import current_container
    from inference.process_lease import ProcessLease

    container = current_container()
    return ProcessLease(container.redis, container.key_prefix, ttl_s=10.0, interval_s=2.0)


async def _kill(process):
    """What SIGKILL leaves: no more refreshes, then the key expires (deleted here: no waiting)."""
    process._task.cancel()
    await process._redis.delete(process.key)


async def test_a_pending_key_names_its_process_which_is_alive_in_redis():
    from inference.idempotency import Claim

    process = _process()
    claim = await _store_of(process).begin(7, "named", "fp")
    assert isinstance(claim, Claim)
    entry = json.loads(await process._redis.get(claim.redis_key))
    assert entry["process"] == process.process_id
    ttl_ms = await process._redis.pttl(process.key)
    assert 0 < ttl_ms <= 10_000
    await process.stop()  # a clean shutdown frees its holdings at once
    assert not await process._redis.exists(process.key)


async def test_a_live_process_keeps_its_key_409():
    from inference.errors import Conflict

    holder, retrier = _process(), _process()
    await _store_of(holder).begin(7, "alive", "fp")
    with pytest.raises(Conflict):
        await _store_of(retrier).begin(7, "alive", "fp")
    await holder.stop()
    await retrier.stop()


async def test_a_dead_process_key_is_taken_over_at_once_and_only_the_new_claim_completes():
    from inference.idempotency import Claim, Replay

    dead, alive = _process(), _process()
    old = await _store_of(dead).begin(7, "crash", "fp")
    await _kill(dead)
    store = _store_of(alive)
    new = await store.begin(7, "crash", "fp")
    assert isinstance(new, Claim) and new.owner != old.owner
    assert json.loads(await store._redis.get(new.redis_key))["process"] == alive.process_id
    assert not await store.refresh(old)  # the dead request (were it still around) lost it
    assert not await store.complete(old, {"text": "late"})
    assert await store.complete(new, {"text": "retry"})
    replay = await store.begin(7, "crash", "fp")
    assert isinstance(replay, Replay) and replay.result == {"text": "retry"}
    await alive.stop()


async def test_takeover_with_another_body_is_still_422():
    from inference.errors import Unprocessable

    dead, alive = _process(), _process()
    await _store_of(dead).begin(7, "crash-422", "fp")
    await _kill(dead)
    with pytest.raises(Unprocessable):
        await _store_of(alive).begin(7, "crash-422", "other")
    await alive.stop()


async def test_concurrent_retries_of_a_dead_claim_take_it_over_once():
    from inference.errors import Conflict
    from inference.idempotency import Claim

    dead, alive = _process(), _process()
    await _store_of(dead).begin(7, "crash-race", "fp")
    await _kill(dead)
    store = _store_of(alive)
    results = await asyncio.gather(*(store.begin(7, "crash-race", "fp") for _ in range(8)),
                                   return_exceptions=True)
    assert sum(isinstance(r, Claim) for r in results) == 1
    assert sum(isinstance(r, Conflict) for r in results) == 7
    await alive.stop()


async def test_an_entry_without_a_process_is_never_taken_over():
    from inference.errors import Conflict

    await _store().begin(7, "anonymous", "fp")  # no process lease: only its TTL frees it
    alive = _process()
    with pytest.raises(Conflict):
        await _store_of(alive).begin(7, "anonymous", "fp")
    await alive.stop()


async def test_the_api_retry_after_its_process_died_succeeds(client, auth, tenant, ready_replica,
                                                             fake_replica):
    """Through the view: the key held by a killed process (its entry pending, its process
    lease gone) does not answer 409; the retry runs and its reply is then replayed."""
    from inference.idempotency import fingerprint

    dead = _process()
    body = {**BODY, "max_tokens": 3}
    await _store_of(dead).begin(tenant.pk, "cut-by-crash", fingerprint("generate", body))
    await _kill(dead)
    headers = {**auth, "Idempotency-Key": "cut-by-crash"}
    first = await post(client, body, headers)
    assert first.status_code == 200, first.content
    assert first.json()["usage"]["output_tokens"] == 3
    assert (await post(client, body, headers)).json() == first.json()
    assert fake_replica.state.num_requests == 1
