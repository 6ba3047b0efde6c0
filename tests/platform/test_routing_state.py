"""The router's shared state in the real Redis: prefix index, circuit breaker, replica signals,
routing counters; the platform's block hashes against the engine's own prefix cache."""
import asyncio

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from asgiref.sync import sync_to_async
from django.conf import settings

from inference.circuit import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from inference.container import current_container
from inference.policies import BLOCK_SIZE
from inference.prefix_index import PrefixIndex, prompt_block_hashes
from inference.replica_signals import ReplicaSignals, SignalPoller, SignalStore, parse_info, parse_metrics
from inference.router import RouteRequest
from models_registry.models import Model
from models_registry.selectors import ReplicaInfo
from models_registry.services import register_replica
from replica.engine.kv.manager import KVCacheManager
from replica.engine.request import Request
from replica.engine.sampling_params import SamplingParams
from replica import metric_names as names
from tests.support.waiting import async_wait_until


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest_asyncio.fixture
async def redis():
    client = aioredis.Redis.from_url(settings.REDIS_URL)
    yield client
    keys = [k async for k in client.scan_iter(match=settings.REDIS_KEY_PREFIX + "t-*")]
    if keys:
        await client.delete(*keys)
    await client.aclose()


PREFIX = settings.REDIS_KEY_PREFIX + "t-"


def test_platform_block_hashes_are_the_engines():
    """The router's hashes name exactly the blocks the engine caches (same function, block
    size and salt), so the prefix index and the replica's prefix cache agree."""
    tokens = list(range(500, 500 + 5 * BLOCK_SIZE + 3))
    kv = KVCacheManager(num_blocks=16, block_size=BLOCK_SIZE)
    request = Request("r", tokens, SamplingParams(max_tokens=1), arrival_time=0.0,
                      cache_salt="42")
    assert kv.allocate(request, len(tokens))
    request.num_computed_tokens = len(tokens)
    kv.cache_full_blocks(request)
    hashes = prompt_block_hashes(tokens, "42", max_blocks=128)
    assert len(hashes) == 5
    for i, block_hash in enumerate(hashes):
        block_tokens = tokens[i * BLOCK_SIZE:(i + 1) * BLOCK_SIZE]
        assert kv.prefix_cache.match(block_hash, block_tokens) == kv.block_table("r")[i]
    # Another tenant's salt names other blocks; max_blocks bounds the work.
    other = prompt_block_hashes(tokens, "43", max_blocks=128)
    assert all(kv.prefix_cache.match(h, tokens[:BLOCK_SIZE]) is None for h in other[:1])
    assert prompt_block_hashes(tokens, "42", max_blocks=2) == hashes[:2]


@pytest.mark.asyncio
async def test_prefix_index_matches_leading_chains_and_forgets(redis):
    clock = Clock()
    index = PrefixIndex(redis, PREFIX, clock, ttl_s=60)
    hashes = [11, 12, 13, 14]
    await index.record(7, hashes, replica_id=1)
    await index.record(7, hashes[:2], replica_id=2)
    await index.record(7, [99, 12, 13], replica_id=3)  # block 12 without block 11: no chain
    assert await index.match(7, hashes, [1, 2, 3, 4]) == {1: 4, 2: 2, 3: 0, 4: 0}
    assert await index.match(8, hashes, [1]) == {1: 0}  # per model version
    await index.forget(7, hashes, replica_id=1)
    assert await index.match(7, hashes, [1, 2]) == {1: 0, 2: 2}
    clock.now += 61  # older than the TTL: ignored even though the key lives on
    await index.record(7, hashes[:1], replica_id=3)
    assert await index.match(7, hashes, [2, 3]) == {2: 0, 3: 1}
    assert 0 < await redis.pttl(index.key(7, 11)) <= 60_000


@pytest.mark.asyncio
async def test_circuit_opens_after_consecutive_failures_then_one_probe(redis):
    clock = Clock()
    circuit = CircuitBreaker(redis, PREFIX, clock, failure_threshold=3, cooldown_s=10,
                             trial_timeout_s=30)
    assert await circuit.record_failure(5) is False
    await circuit.record_success(5)  # not consecutive: the count starts over
    assert [await circuit.record_failure(5) for _ in range(3)] == [False, False, True]
    assert await circuit.states([5, 6]) == {5: OPEN, 6: CLOSED}
    assert await circuit.record_failure(5) is False  # in flight when it opened: no change
    clock.now += 10
    assert await circuit.states([5]) == {5: HALF_OPEN}
    assert await circuit.try_half_open_trial(5) is True
    assert await circuit.try_half_open_trial(5) is False  # exactly one trial
    assert await circuit.record_failure(5) is True  # the trial failed: open again
    assert await circuit.states([5]) == {5: OPEN}
    clock.now += 10
    assert await circuit.try_half_open_trial(5) is True  # the failed trial's claim was dropped
    await circuit.record_success(5)
    assert await circuit.states([5]) == {5: CLOSED}


def test_parse_metrics_reads_the_replicas_port():
    labels = '{model="chat-small",version="1"}'
    text = (f"# HELP {names.KV_FREE_BLOCKS} Free KV cache blocks\n"
            f"# TYPE {names.KV_FREE_BLOCKS} gauge\n"
            f"{names.KV_FREE_BLOCKS}{labels} 120\n"
            f"{names.KV_FREE_UNCACHED_BLOCKS}{labels} 90\n"
            f"{names.KV_TOTAL_BLOCKS}{labels} 200\n"
            f"{names.WAITING_SEQS}{labels} 3\n"
            f"{names.RUNNING_SEQS}{labels} 2\n"
            f"{names.PREFIX_CACHE_HIT_TOKENS}{labels} 4096\n"
            f"nv_inference_count{labels} 9\n")  # Triton's own: not read
    assert parse_metrics(text) == ReplicaSignals(
        running_seqs=2, waiting_seqs=3, kv_free_blocks=120, kv_free_uncached_blocks=90,
        kv_total_blocks=200, prefix_hit_tokens=4096)


def test_parse_metrics_reads_a_pool_of_zero_blocks_as_unknown():
    # Gauges at their 0 before the engine published them: no pool, not a full one.
    labels = '{model="chat-small",version="1"}'
    text = (f"{names.KV_FREE_BLOCKS}{labels} 0\n"
            f"{names.KV_FREE_UNCACHED_BLOCKS}{labels} 0\n"
            f"{names.KV_TOTAL_BLOCKS}{labels} 0\n"
            f"{names.WAITING_SEQS}{labels} 0\n")
    assert parse_metrics(text) == ReplicaSignals(waiting_seqs=0)
    # A real pool with nothing free is a full one.
    full = text.replace(f"{names.KV_TOTAL_BLOCKS}{labels} 0", f"{names.KV_TOTAL_BLOCKS}{labels} 200")
    assert parse_metrics(full) == ReplicaSignals(waiting_seqs=0, kv_free_blocks=0,
                                                 kv_free_uncached_blocks=0, kv_total_blocks=200)


def test_parse_info_reads_what_the_engine_runs():
    text = (f"# TYPE {names.ENGINE_INFO} gauge\n"
            f'{names.ENGINE_INFO}{{dtype="float32",model="chat-small",quantization="int8",version="2"}} 1\n'
            f'{names.RUNNING_SEQS}{{model="chat-small",version="2"}} 0\n')
    assert parse_info(text) == {"dtype": "float32", "model": "chat-small", "quantization": "int8",
                                "version": "2"}
    assert parse_info(f'{names.RUNNING_SEQS}{{model="m",version="1"}} 0\n') == {}


async def _read_is_empty(store, replica_id: int) -> bool:
    return await store.read([replica_id]) == {}


@pytest.mark.asyncio
async def test_signal_poller_shares_fresh_signals_once_per_tick(redis, fake_replica):
    store = SignalStore(redis, PREFIX, ttl_s=0.3)
    first = SignalPoller(store, interval_s=1.0, timeout_s=2.0)
    second = SignalPoller(store, interval_s=1.0, timeout_s=2.0)  # another platform process
    info = ReplicaInfo(replica_id=9, grpc_address="", metrics_address=fake_replica.metrics_address,
                       zone="")
    first._interval = second._interval = 0  # no background task: ticks driven by the test
    first.watch([info])
    second.watch([info])
    first._interval = second._interval = 1.0
    try:
        assert (await first.poll_once()).keys() == {9}
        assert await second.poll_once() == {}  # this tick's lease is taken
        assert (await store.read([9]))[9].running_seqs == 0
        assert await redis.pttl(store.key(9)) <= 300  # at most the TTL left (-2: gone already)
        await async_wait_until(lambda: _read_is_empty(store, 9), 5.0, "stale signals expiring")
        assert await store.read([9]) == {}  # stale signals expire
        first.forget_after_s = 0.0  # no longer offered by the router: no longer polled
        assert await first.poll_once() == {} and first._watched == {}
    finally:
        await first.stop()
        await second.stop()


@pytest.mark.asyncio
async def test_signals_read_again_are_parsed_again_only_when_they_changed(redis):
    """Every routing snapshot reads the replicas' signals: a row read as it was last time
    gives that parse (the same frozen object); a changed row, a new one; a gone row, none."""
    store = SignalStore(redis, PREFIX, ttl_s=30)
    await store.write(7, ReplicaSignals(running_seqs=1, kv_free_blocks=10))
    await store.write(8, ReplicaSignals(waiting_seqs=2))
    first = await store.read([7, 8])
    again = await store.read([7, 8])
    assert again[7] is first[7] and again[8] is first[8]
    assert first[7] == ReplicaSignals(running_seqs=1, kv_free_blocks=10)
    await store.write(7, ReplicaSignals(running_seqs=2, kv_free_blocks=10))
    changed = await store.read([7, 8])
    assert changed[7] == ReplicaSignals(running_seqs=2, kv_free_blocks=10)
    assert changed[8] is first[8]
    await redis.delete(store.key(7))
    assert (await store.read([7, 8])).keys() == {8}


pytestmark_db = pytest.mark.django_db(transaction=True)

REQUEST = RouteRequest(tenant_id=1, num_prompt_tokens=100, max_tokens=20,
                       block_hashes=(1, 2, 3, 4, 5, 6))


@pytestmark_db
@pytest.mark.asyncio
async def test_router_skips_open_circuits_and_probes_half_open(model_version):
    r1 = await sync_to_async(register_replica)(model_version, "127.0.0.1:9001")
    r2 = await sync_to_async(register_replica)(model_version, "127.0.0.1:9002")
    router = current_container().router
    circuit = router.state.circuit
    for _ in range(circuit.failure_threshold):
        await circuit.record_failure(r1.pk)
    for _ in range(4):
        lease = await router.acquire(model_version.pk, "round_robin", REQUEST)
        assert lease.replica.replica_id == r2.pk
        await lease.release()
    # Cool-down over (moved into the past): the next request is the single trial.
    await circuit._redis.hset(circuit.key(r1.pk), "open_until", 1)
    trial = await router.acquire(model_version.pk, "balanced", REQUEST)
    assert (trial.replica.replica_id, trial.is_half_open_trial) == (r1.pk, True)
    other = await router.acquire(model_version.pk, "balanced", REQUEST)
    assert other.replica.replica_id == r2.pk
    await router.first_token(trial)  # the trial succeeded: closed
    assert (await circuit.states([r1.pk]))[r1.pk] == CLOSED
    for lease in (trial, other):
        await lease.release()


@pytestmark_db
@pytest.mark.asyncio
async def test_router_sends_a_shared_prefix_back_and_charges_only_missed_prompt(model_version):
    r1 = await sync_to_async(register_replica)(model_version, "127.0.0.1:9001")
    r2 = await sync_to_async(register_replica)(model_version, "127.0.0.1:9002")
    router = current_container().router
    first = await router.acquire(model_version.pk, "balanced", REQUEST)
    assert first.num_prompt_tokens == 100  # cold: the whole prompt
    await first.release()
    again = await router.acquire(model_version.pk, "balanced", REQUEST)
    assert again.replica.replica_id == first.replica.replica_id
    assert again.num_prompt_tokens == 100 - 6 * 16  # 6 blocks expected from its cache
    await router.failed(again, before_first_token=True, retrying=True)
    await again.release()
    # It failed before computing anything: the index forgot the prefix there.
    matched = await router.state.prefix_index.match(model_version.pk, REQUEST.block_hashes,
                                                    [r1.pk, r2.pk])
    assert matched[again.replica.replica_id] == 0


@pytestmark_db
@pytest.mark.asyncio
async def test_routing_policy_change_reaches_the_catalog_within_the_ttl(model_version, tenant):
    from inference.router import ServingCatalog

    clock = Clock()
    catalog = ServingCatalog(clock, ttl_seconds=1.0)
    assert (await catalog.get("chat-small", tenant.pk)).routing_policy == "balanced"
    await Model.objects.filter(name="chat-small").aupdate(routing_policy="round_robin")
    assert (await catalog.get("chat-small", tenant.pk)).routing_policy == "balanced"  # cached
    clock.now += 1.0
    assert (await catalog.get("chat-small", tenant.pk)).routing_policy == "round_robin"


@pytestmark_db
@pytest.mark.asyncio
async def test_catalog_reloads_ahead_off_the_request_and_gives_its_connection_back(
        model_version, tenant):
    """The request path's registry caches read PostgreSQL again in the background before the
    value expires (REGISTRY_CACHE_REFRESH_AHEAD): the request that finds it due gets the held
    value at once, and the reload's connection goes back to the pool."""
    import contextvars

    from django.db import connection

    from inference.router import ServingCatalog

    clock = Clock()
    catalog = ServingCatalog(clock, ttl_seconds=1.0)  # reloaded ahead after 0.75 s
    assert (await catalog.get("chat-small", tenant.pk)).routing_policy == "balanced"
    await Model.objects.filter(name="chat-small").aupdate(routing_policy="round_robin")
    clock.now += 0.75
    assert (await catalog.get("chat-small", tenant.pk)).routing_policy == "balanced"  # held
    await catalog._cache.refreshed()
    clock.now += 0.2  # 0.95 s after the first read: fresh, and read again by the reload
    assert (await catalog.get("chat-small", tenant.pk)).routing_policy == "round_robin"

    def held_connection() -> bool:  # on the thread the reload ran on
        return connection.connection is not None

    check = asyncio.get_running_loop().create_task(sync_to_async(held_connection)(),
                                                   context=contextvars.Context())
    assert await check is False


@pytestmark_db
def test_admin_validates_the_policy_name(admin_client, model_version):
    model = Model.objects.get(name="chat-small")
    url = f"/admin/models_registry/model/{model.pk}/change/"
    form = {"name": "chat-small", "description": "", "is_public": "on",
            "routing_policy": "fastest", "versions-TOTAL_FORMS": "0",
            "versions-INITIAL_FORMS": "0"}
    response = admin_client.post(url, form)
    assert response.status_code == 200 and b"Select a valid choice" in response.content
    response = admin_client.post(url, {**form, "routing_policy": "prefix_affinity"})
    assert response.status_code == 302
    assert Model.objects.get(pk=model.pk).routing_policy == "prefix_affinity"


@pytestmark_db
@pytest.mark.asyncio
async def test_concurrent_decisions_see_each_others_load(model_version):
    """Requests routed at the same moment in one process do not all read the same loads:
    three different new prefixes at once land on three replicas."""
    import asyncio

    ids = {(await sync_to_async(register_replica)(model_version, f"127.0.0.1:{9001 + i}")).pk
           for i in range(3)}
    router = current_container().router
    requests = [RouteRequest(1, 100, 20, block_hashes=(h, h + 1)) for h in (10, 20, 30)]
    leases = await asyncio.gather(*(router.acquire(model_version.pk, "balanced", r)
                                    for r in requests))
    assert {lease.replica.replica_id for lease in leases} == ids
    for lease in leases:
        await lease.release()
