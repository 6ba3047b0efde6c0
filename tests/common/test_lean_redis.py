"""common/lean_redis.py: plain pipelines sent over the lean connection give what redis-py's
pipeline gives (the same results through the same reply callbacks, the same error instances);
callers in one loop iteration share one write (or one a group of `flush_batches`); a
connection that died while idle is replaced transparently; a hung Redis fails every waiting
round trip with redis.TimeoutError within the socket timeout and service comes back on a new
connection; a cancelled caller's replies never reach another; transactions and redis-py
Scripts queued on a pipeline still go through redis-py. Against the test Redis (REDIS_URL)
and, for the faults, a private redis-server."""
from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
import redis.asyncio as aioredis
from django.conf import settings
from redis.exceptions import NoScriptError, ResponseError

from common.lean_redis import LeanConnection, LeanPipeline, LeanRedis
from llm_platform.redis_clients import async_redis
from tests.support.private_redis import PrivateRedis

pytestmark = pytest.mark.asyncio


def client(url: str, socket_timeout: float = 2.0, flush_batches: int = 0) -> LeanRedis:
    pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=4, timeout=2.0,
                                                    socket_timeout=socket_timeout,
                                                    socket_connect_timeout=socket_timeout)
    return LeanRedis.on_pool(pool, flush_batches)


def queue_everything(pipe, key: str, sha: str) -> None:
    pipe.set(key + ":s", "v", px=30000)
    pipe.set(key + ":s", "w", nx=True)  # refused: None
    pipe.get(key + ":s")
    pipe.hset(key + ":h", mapping={"a": 1, "b": "x"})
    pipe.hgetall(key + ":h")
    pipe.hmget(key + ":h", ["a", "nope"])
    pipe.hincrby(key + ":h", "a", 5)
    pipe.hincrbyfloat(key + ":h", "f", 0.1)
    pipe.incr(key + ":n")
    pipe.incrby(key + ":n", 41)
    pipe.sadd(key + ":set", 1, 2)
    pipe.smembers(key + ":set")
    pipe.zadd(key + ":z", {"m": 1.5})
    pipe.zrange(key + ":z", 0, -1, withscores=True)
    pipe.zscore(key + ":z", "m")
    pipe.xadd(key + ":x", {"e": "{}"}, maxlen=100, approximate=False)
    pipe.xlen(key + ":x")
    pipe.exists(key + ":s", key + ":nope")
    pipe.pexpire(key + ":h", 30000)
    pipe.hincrby(key + ":s", "a", 1)  # WRONGTYPE: an error among the results
    pipe.evalsha(sha, 2, key + ":a", key + ":b", "x", 7)
    pipe.evalsha("0" * 40, 0)  # NOSCRIPT
    pipe.delete(key + ":s", key + ":h", key + ":n", key + ":set", key + ":z", key + ":x")


def comparable(results: list) -> list:
    out = []
    for r in results:
        if isinstance(r, Exception):
            out.append((type(r).__name__, str(r)))
        elif isinstance(r, (str, bytes)) and len(r) == len(b"1700000000000-0") and b"-" in (
                r if isinstance(r, bytes) else r.encode()):
            out.append("stream-id")
        else:
            out.append(r)
    return out


async def test_a_plain_pipeline_gives_what_redis_py_gives():
    lean = client(settings.REDIS_URL)
    plain = aioredis.Redis.from_url(settings.REDIS_URL)
    sha = await plain.script_load("return {KEYS[1], ARGV[1], tonumber(ARGV[2]) + 1, "
                                  "{ok='fine'}}")
    try:
        got, want = [], []
        key = f"lean-test:{uuid.uuid4().hex}"  # the pipeline deletes its keys at its end
        for target, out in ((lean, got), (plain, want)):
            pipe = target.pipeline(transaction=False)
            queue_everything(pipe, key, sha)
            out.extend(await pipe.execute(raise_on_error=False))
        assert isinstance(lean.pipeline(transaction=False), LeanPipeline)
        assert comparable(got) == comparable(want)
        assert isinstance(got[-2], NoScriptError) and isinstance(got[-4], ResponseError)
        key = f"lean-test:{uuid.uuid4().hex}"
        pipe = lean.pipeline(transaction=False)
        pipe.set(key, "v")
        pipe.hincrby(key, "a", 1)
        with pytest.raises(ResponseError, match="Command # 2"):
            await pipe.execute()
        # Emptied after each execute, failed or not: the same pipeline sends only what was
        # queued since.
        assert pipe.command_stack == []
        pipe.get(key)
        assert await pipe.execute() == [b"v"]
        pipe.exists(key)
        assert await pipe.execute() == [1] and pipe.command_stack == []
        await plain.delete(key)
        # Transactions and pipelines holding redis-py Scripts are redis-py's own.
        assert not isinstance(lean.pipeline(), LeanPipeline)
        async with lean.pipeline() as tx:
            assert await tx.incr(key + ":t").expire(key + ":t", 5).execute() == [1, True]
        script = lean.register_script("return 5")
        pipe = lean.pipeline(transaction=False)
        await script(keys=[], args=[], client=pipe)
        assert await pipe.execute() == [5]
    finally:
        await lean.aclose()
        await plain.aclose()


async def test_the_platform_client_uses_it_unless_turned_off(settings):
    made = async_redis()
    assert isinstance(made, LeanRedis) and made.lean is not None
    await made.aclose()
    settings.REDIS_LEAN_PIPELINES = False
    made = async_redis()
    assert not isinstance(made.pipeline(transaction=False), LeanPipeline)
    await made.aclose()


async def test_new_connections_do_not_look_the_library_version_up(monkeypatch):
    # Each new redis-py connection read the installed packages' metadata for CLIENT SETINFO
    # (~5 ms each in a fresh API process); the platform's clients resolve it once.
    from importlib import metadata

    from llm_platform.cache import SharedConnectionPool
    from llm_platform.redis_clients import sync_redis

    async_client, sync_client = async_redis(), sync_redis()
    django_cache = redis.Redis(connection_pool=SharedConnectionPool.from_url(settings.REDIS_URL))

    def lookup(name):
        raise AssertionError(f"importlib.metadata.version({name!r}) per connection")

    monkeypatch.setattr(metadata, "version", lookup)
    try:
        for made in (async_client, sync_client, django_cache):
            connection = made.connection_pool.make_connection()
            assert connection.driver_info.lib_version == redis.__version__
            assert connection.driver_info.formatted_name == "redis-py"
        await async_client.execute_command("PING")  # and it connects and serves
        assert sync_client.ping() and django_cache.ping()
    finally:
        await async_client.aclose()
        sync_client.close()


async def test_a_connection_that_died_while_idle_is_replaced():
    lean = client(settings.REDIS_URL)
    plain = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        name = f"lean-{uuid.uuid4().hex[:8]}"
        pipe = lean.pipeline(transaction=False)
        pipe.client_setname(name)
        pipe.ping()
        assert await pipe.execute() == [True, True]
        killed = None
        for entry in await plain.client_list():
            if entry.get("name") == name:
                await plain.execute_command("CLIENT", "KILL", "ID", entry["id"])
                killed = entry["id"]
        assert killed is not None
        pipe = lean.pipeline(transaction=False)
        pipe.ping()
        assert await pipe.execute() == [True]
        # Closed (aclose) while a call waits: it is sent again on a new connection; a later
        # call connects again, as with redis-py's client.
        waiting = asyncio.ensure_future(ping(lean, "during"))
        await asyncio.sleep(0)
        await lean.aclose()
        assert await waiting == [b"during"]
        assert await ping(lean, "after") == [b"after"]
    finally:
        await lean.aclose()
        await plain.aclose()


async def ping(lean: LeanRedis, word: str = "x") -> list:
    pipe = lean.pipeline(transaction=False)
    pipe.echo(word)
    return await pipe.execute()


def record_sends(monkeypatch) -> list[bytes]:
    sent: list[bytes] = []
    real_send = LeanConnection.send
    monkeypatch.setattr(LeanConnection, "send",
                        lambda self, packed: sent.append(packed) or real_send(self, packed))
    return sent


@pytest.mark.parametrize("flush_batches, groups", [(0, [20]), (8, [8, 8, 4]), (1, [1] * 20),
                                                   (20, [20]), (32, [20])])
async def test_callers_of_one_loop_iteration_share_one_write_or_one_per_group(
        monkeypatch, flush_batches, groups):
    """One write for every batch queued in one iteration (`flush_batches` 0); else each
    `flush_batches` of them go out as they are queued (Redis starts on them while the loop
    makes the rest), the remainder at the iteration's end. Every caller gets its own replies."""
    lean = client(settings.REDIS_URL, flush_batches=flush_batches)
    sent = record_sends(monkeypatch)
    try:
        await ping(lean)  # connected
        sent.clear()
        words = [f"w{i}" for i in range(20)]
        assert await asyncio.gather(*(ping(lean, w) for w in words)) == [
            [w.encode()] for w in words]
        assert [packed.count(b"ECHO") for packed in sent] == groups
        assert b"".join(sent).index(b"w19") > b"".join(sent).index(b"w0")  # queued order
    finally:
        await lean.aclose()


async def test_batches_queued_before_the_connection_is_up_go_out_once_it_is(monkeypatch):
    """A group that fills before the first connection is made waits for it with the rest."""
    lean = client(settings.REDIS_URL, flush_batches=2)
    sent = record_sends(monkeypatch)
    try:
        words = [f"w{i}" for i in range(5)]
        assert await asyncio.gather(*(ping(lean, w) for w in words)) == [
            [w.encode()] for w in words]
        assert sum(packed.count(b"ECHO") for packed in sent) == 5
    finally:
        await lean.aclose()


async def test_the_platform_client_writes_in_groups_of_the_setting(monkeypatch, settings):
    settings.REDIS_LEAN_FLUSH_BATCHES = 3
    made = async_redis()
    sent = record_sends(monkeypatch)
    try:
        await ping(made)
        sent.clear()
        await asyncio.gather(*(ping(made, f"w{i}") for i in range(7)))
        assert [packed.count(b"ECHO") for packed in sent] == [3, 3, 1]
    finally:
        await made.aclose()


async def test_a_hung_redis_times_out_every_waiting_caller_and_service_comes_back():
    server = PrivateRedis().start()
    lean = client(server.url, socket_timeout=0.5)
    try:
        assert await ping(lean) == [b"x"]
        server.pause()
        first = asyncio.ensure_future(ping(lean, "a"))
        await asyncio.sleep(0.2)
        second = asyncio.ensure_future(ping(lean, "b"))  # waits on the same connection
        results = await asyncio.gather(first, second, return_exceptions=True)
        assert [type(r) for r in results] == [redis.TimeoutError, redis.TimeoutError]
        server.resume()
        assert await ping(lean, "c") == [b"c"]  # on a new connection
        # A caller cancelled mid round trip: its replies are read and dropped, never handed
        # to the next caller.
        server.pause()
        task = asyncio.ensure_future(ping(lean, "gone"))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        server.resume()
        assert await ping(lean, "next") == [b"next"]
        server.stop()
        with pytest.raises(redis.ConnectionError):
            await ping(lean)
    finally:
        await lean.aclose()
        server.stop()


async def test_a_script_call_goes_over_the_lean_pool_and_loads_itself_on_noscript(monkeypatch):
    server = PrivateRedis().start()  # a fresh script cache: the first EVALSHA gets NOSCRIPT
    lean = client(server.url)
    sent = []
    real_send = LeanConnection.send
    monkeypatch.setattr(LeanConnection, "send",
                        lambda self, packed: sent.append(packed) or real_send(self, packed))
    try:
        add = lean.register_script("return tonumber(ARGV[1]) + 1")
        assert await add(keys=[], args=[41]) == 42
        assert await add(keys=[], args=[1]) == 2
        commands = [p.split(b"\r\n")[2] for p in sent]
        assert commands == [b"HELLO", b"EVALSHA", b"EVALSHA", b"EVALSHA"]  # NOSCRIPT, then ran
        boom = lean.register_script("return redis.error_reply('boom')")
        with pytest.raises(ResponseError, match="boom"):
            await boom(keys=[], args=[])
        assert await lean.set("plain", "x") is True  # not EVALSHA: redis-py's own
        assert len([p for p in sent if b"SET" in p]) == 0
    finally:
        await lean.aclose()
        server.stop()


async def test_commands_are_packed_as_redis_py_packs_them():
    from redis.asyncio.connection import Connection
    from redis.exceptions import DataError

    lean = client(settings.REDIS_URL)
    reference = Connection()
    commands = [("EVALSHA", "a" * 40, 2, "k:1", "k:2", 1796122785764, -3, 0.1, 1e-05, 1e16,
                 12345678.9, "héllo ☃", b"\x00\xffraw", memoryview(b"view")),
                ("CLIENT SETNAME", "name"), ("SET", "k", "")]
    assert lean.lean.pack(commands) == b"".join(
        b"".join(reference.pack_command(*c)) for c in commands)
    with pytest.raises(DataError):
        lean.lean.pack([("SET", "k", True)])
    await lean.aclose()


async def test_concurrent_callers_each_get_their_own_replies():
    """Many callers' batches interleaved on the one connection, of different sizes and with
    error replies among them: each caller gets exactly its own results, in its order."""
    lean = client(settings.REDIS_URL)
    base = f"lean-test:{uuid.uuid4().hex}"

    async def one(i: int) -> list:
        pipe = lean.pipeline(transaction=False)
        for j in range(i % 5 + 1):
            pipe.incrby(f"{base}:{i}", j + 1)
        pipe.echo(f"caller {i}")
        if i % 7 == 0:
            pipe.hget(f"{base}:{i}", "x")  # WRONGTYPE on a string key
        pipe.delete(f"{base}:{i}")
        return await pipe.execute(raise_on_error=False)

    try:
        results = await asyncio.gather(*(one(i) for i in range(300)))
        for i, got in enumerate(results):
            n = i % 5 + 1
            assert got[:n] == [sum(range(1, j + 2)) for j in range(n)], (i, got)
            assert got[n] == f"caller {i}".encode()
            if i % 7 == 0:
                assert isinstance(got[n + 1], ResponseError)
            assert got[-1] == 1
    finally:
        await lean.aclose()


async def test_a_push_message_on_the_connection_is_not_taken_for_a_reply():
    """RESP3 push messages (none is asked for in production; here client-side caching's
    invalidation) are skipped, not handed to the next caller as its reply."""
    lean = client(settings.REDIS_URL)
    plain = aioredis.Redis.from_url(settings.REDIS_URL)
    key = f"lean-test:{uuid.uuid4().hex}"
    try:
        pipe = lean.pipeline(transaction=False)
        pipe.execute_command("CLIENT TRACKING", "ON")
        pipe.get(key)
        assert (await pipe.execute())[1] is None
        connection = lean.lean._connection
        await plain.set(key, "changed")  # Redis pushes an invalidation to the lean connection
        # The push comes before this reply on the connection: skipped, the connection kept.
        assert await ping(lean, "after") == [b"after"]
        assert lean.lean._connection is connection and connection.broken is None
    finally:
        await plain.delete(key)
        await lean.aclose()
        await plain.aclose()


async def test_run_script_goes_over_the_lean_pool_and_loads_the_script_on_noscript(monkeypatch):
    """common.pipelines.run_script: the EVALSHA a registered script's call sends, on the lean
    pool; a Redis without the script (a fresh cache) gets it loaded, then the call again."""
    from common.pipelines import run_script

    server = PrivateRedis().start()  # a fresh script cache: the first EVALSHA gets NOSCRIPT
    lean = client(server.url)
    sent = []
    real_send = LeanConnection.send
    monkeypatch.setattr(LeanConnection, "send",
                        lambda self, packed: sent.append(packed) or real_send(self, packed))
    try:
        add = lean.register_script("return tonumber(ARGV[1]) + #KEYS")
        assert await run_script(add, ["k1", "k2"], [40]) == 42
        assert await run_script(add, [], [1]) == 1
        assert [p.split(b"\r\n")[2] for p in sent] == [b"HELLO", b"EVALSHA", b"EVALSHA",
                                                       b"EVALSHA"]  # NOSCRIPT, then ran
        boom = lean.register_script("return redis.error_reply('boom')")
        with pytest.raises(ResponseError, match="boom"):
            await run_script(boom, [], [])
    finally:
        await lean.aclose()
        server.stop()
