"""A request's end in one round trip, on the real Redis: `common.pipelines.Batch` (each part
gets its own results; a script Redis does not know runs again alone, nothing else twice; a
failed pipeline reaches every part) and the final usage event's script (the usage lease goes
only once the event is in the stream; otherwise the event goes to the outbox first)."""
import time
import uuid

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError

from billing.events import UsageEvent
from billing.leases import UsageLease
from billing.outbox import FileOutbox
from billing.stream import FIELD, StreamKeys, UsageRecorder
from common.pipelines import Batch
from scripts.services import free_port

pytestmark = pytest.mark.asyncio


@pytest_asyncio.fixture
async def redis():
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    yield client
    await client.aclose()


def part(seen: dict, name: str, queue):
    def add(batch):
        queue(batch)

        async def finish(results):
            seen[name] = results
        return finish
    return add


async def test_a_batch_is_one_pipeline_whose_parts_get_their_own_results(redis):
    key = f"{settings.REDIS_KEY_PREFIX}test-batch:{uuid.uuid4().hex}"
    # A script this Redis has never seen (unique text): its EVALSHA answers NOSCRIPT.
    script = redis.register_script(f"-- {uuid.uuid4().hex}\n"
                                   "return redis.call('INCRBY', KEYS[1], ARGV[1])")
    seen: dict = {}
    batch = Batch(redis)
    batch.add(part(seen, "first", lambda b: (b.pipe.set(f"{key}:a", 1),
                                             b.pipe.incr(f"{key}:a"))))
    batch.add(part(seen, "second", lambda b: (b.script(script, [f"{key}:b"], [5]),
                                              b.pipe.lpush(f"{key}:a", "x"))))
    await batch.execute(5.0)
    assert seen["first"] == [True, 2]
    assert seen["second"][0] == 5  # loaded and run again on its own
    assert isinstance(seen["second"][1], ResponseError)  # WRONGTYPE: a result, not raised
    assert int(await redis.get(f"{key}:b")) == 5  # the script ran once
    assert int(await redis.get(f"{key}:a")) == 2  # nothing else was sent twice
    await redis.delete(f"{key}:a", f"{key}:b")


async def test_a_failed_batch_reaches_every_part():
    down = aioredis.Redis(port=free_port(), socket_connect_timeout=0.5)  # nothing listens
    seen: dict = {}
    batch = Batch(down)
    batch.add(part(seen, "one", lambda b: b.pipe.get("x")))
    batch.add(part(seen, "two", lambda b: b.pipe.get("y")))
    await batch.execute(5.0)
    assert set(seen) == {"one", "two"}
    for results in seen.values():
        assert len(results) == 1 and isinstance(results[0], (RedisConnectionError, OSError))
    await down.aclose()


def final_event(request_id: str) -> UsageEvent:
    return UsageEvent(request_id=request_id, tenant_id=1, api_key_id=1, model_name="chat-small",
                      model_version_id=1, replica_id=None, input_tokens=10, cached_tokens=0,
                      output_tokens=5, ttft_ms=1.0, total_ms=2.0, status="ok",
                      finish_reason="stop", endpoint="generate")


async def test_the_final_event_then_the_lease_in_one_script(redis, tmp_path):
    prefix = f"{settings.REDIS_KEY_PREFIX}end-{uuid.uuid4().hex[:8]}:"
    keys = StreamKeys(prefix)
    outbox = FileOutbox(tmp_path)
    recorder = UsageRecorder(redis, keys, outbox, time.time)

    # Redis takes the event: it is in the stream and the lease is gone, nothing in the outbox.
    lease = UsageLease(redis, prefix, "req-ok", ttl_s=30)
    await lease.set()
    batch = Batch(redis)
    batch.add(lambda b: recorder.queue_final(b, final_event("req-ok"), lease))
    await batch.execute(5.0)
    entries = await redis.xrange(keys.stream)
    assert [UsageEvent.from_json(fields[FIELD.encode()]).request_id
            for _, fields in entries] == ["req-ok"]
    assert not await redis.exists(lease.key)
    assert not outbox.has_pending()

    # Redis refuses the XADD (here: the stream key holds a string): the script stops before
    # the DEL; the event goes to the outbox, and only then is the lease released.
    await redis.delete(keys.stream)
    await redis.set(keys.stream, "not a stream")
    lease = UsageLease(redis, prefix, "req-refused", ttl_s=30)
    await lease.set()
    held_after_script = []
    real_append = outbox.append

    def append(events):
        held_after_script.append(redis_sync_exists(lease.key))
        real_append(events)
    outbox.append = append
    batch = Batch(redis)
    batch.add(lambda b: recorder.queue_final(b, final_event("req-refused"), lease))
    await batch.execute(5.0)
    assert held_after_script == [True]  # the lease outlived the refused XADD
    replayed: list = []
    outbox.replay(replayed.extend)
    assert [e.request_id for e in replayed] == ["req-refused"]
    assert not await redis.exists(lease.key)
    await redis.delete(keys.stream)


def redis_sync_exists(key: str) -> bool:
    import redis as sync_redis
    client = sync_redis.Redis.from_url(settings.REDIS_URL)
    try:
        return bool(client.exists(key))
    finally:
        client.close()
