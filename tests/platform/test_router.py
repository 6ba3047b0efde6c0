"""Router: the policy on fixed snapshots (exact choices) and the shared counts in Redis."""
import random

import pytest

from inference.container import current_container
from inference.router import (
    Candidate,
    LeastOutstandingTokens,
    NoReplicaReady,
    OutstandingTokens,
    RouteRequest,
)
from models_registry.selectors import ReplicaInfo
from models_registry.services import register_replica


def replica(replica_id: int) -> ReplicaInfo:
    return ReplicaInfo(replica_id=replica_id, grpc_address=f"h:{replica_id}",
                       metrics_address="", zone="")


REQUEST = RouteRequest(tenant_id=1, num_prompt_tokens=10, max_tokens=20)


def test_least_outstanding_tokens_picks_the_minimum():
    policy = LeastOutstandingTokens(random.Random(0))
    candidates = [Candidate(replica(1), 500), Candidate(replica(2), 30), Candidate(replica(3), 90)]
    assert policy.choose(REQUEST, candidates).replica.replica_id == 2


def test_ties_are_broken_among_the_least_loaded_only():
    policy = LeastOutstandingTokens(random.Random(0))
    candidates = [Candidate(replica(1), 5), Candidate(replica(2), 0), Candidate(replica(3), 0)]
    chosen = {policy.choose(REQUEST, candidates).replica.replica_id for _ in range(50)}
    assert chosen == {2, 3}


def test_cost_is_prompt_plus_max_tokens():
    assert REQUEST.cost_tokens == 30


pytestmark_db = pytest.mark.django_db(transaction=True)


@pytestmark_db
@pytest.mark.asyncio
async def test_router_spreads_by_outstanding_tokens_and_releases(model_version):
    from asgiref.sync import sync_to_async

    r1 = await sync_to_async(register_replica)(model_version, "127.0.0.1:9001")
    r2 = await sync_to_async(register_replica)(model_version, "127.0.0.1:9002")
    router = current_container().router
    first = await router.acquire(model_version.pk, "least_outstanding_tokens", REQUEST)
    second = await router.acquire(model_version.pk, "least_outstanding_tokens", REQUEST)
    assert {first.replica.replica_id, second.replica.replica_id} == {r1.pk, r2.pk}
    counter = OutstandingTokens(current_container().redis, current_container().key_prefix)
    assert await counter.read(model_version.pk, [r1.pk, r2.pk]) == {r1.pk: 30, r2.pk: 30}
    await first.release_prompt()
    held = first.replica.replica_id
    assert (await counter.read(model_version.pk, [held]))[held] == 20
    # A third request goes to the replica whose prompt is done (less outstanding).
    third = await router.acquire(model_version.pk, "least_outstanding_tokens", REQUEST)
    assert third.replica.replica_id == held
    for lease in (first, second, third):
        await lease.release()
        await lease.release()  # idempotent
    assert await counter.read(model_version.pk, [r1.pk, r2.pk]) == {r1.pk: 0, r2.pk: 0}


@pytestmark_db
@pytest.mark.asyncio
async def test_router_excludes_tried_replicas(model_version):
    from asgiref.sync import sync_to_async

    r1 = await sync_to_async(register_replica)(model_version, "127.0.0.1:9001")
    router = current_container().router
    with pytest.raises(NoReplicaReady):
        await router.acquire(model_version.pk, "least_outstanding_tokens", REQUEST,
                             exclude=frozenset({r1.pk}))


@pytestmark_db
@pytest.mark.asyncio
async def test_decisions_are_not_serialised(model_version):
    """No lock orders a process's decisions: a burst of decisions is in flight together (the
    Redis server sees their snapshot reads before the first lease is written), and they
    still spread by load across the replicas (each sees the ones decided before it)."""
    import asyncio

    from asgiref.sync import sync_to_async

    ids = {(await sync_to_async(register_replica)(model_version, f"127.0.0.1:{9001 + i}")).pk
           for i in range(2)}
    router = current_container().router
    started = asyncio.Event()
    entered = []
    real_snapshot = router.snapshot

    async def counting_snapshot(*args, **kwargs):
        entered.append(1)
        if len(entered) == 8:
            started.set()
        await asyncio.wait_for(started.wait(), 30)  # all eight are deciding at once
        return await real_snapshot(*args, **kwargs)

    router.snapshot = counting_snapshot
    try:
        leases = await asyncio.gather(*(router.acquire(model_version.pk, "least_outstanding_tokens",
                                                       REQUEST) for _ in range(8)))
    finally:
        del router.snapshot
    chosen = [lease.replica.replica_id for lease in leases]
    assert {rid: chosen.count(rid) for rid in ids} == {rid: 4 for rid in ids}
    for lease in leases:
        await lease.release()


@pytest.mark.asyncio
async def test_outstanding_tokens_are_leases_reclaimed_when_their_holder_is_gone():
    import time as time_module
    import uuid

    from django.conf import settings

    clock_now = [time_module.time()]
    counter = OutstandingTokens(current_container().redis,
                                f"{settings.REDIS_KEY_PREFIX}{uuid.uuid4().hex[:6]}:",
                                lambda: clock_now[0], ttl_s=30.0)
    await counter.hold(7, "alive", 1, 100)
    await counter.hold(7, "dead", 1, 50)  # its process died: never refreshed nor released
    await counter.give_back(7, "alive", 1, 40)  # the prompt is done
    assert await counter.read(7, [1]) == {1: 110}
    clock_now[0] += 20
    assert await counter.refresh(7, "alive")
    clock_now[0] += 15
    assert await counter.read(7, [1]) == {1: 60}  # the dead lease's 50 came back
    await counter.give_back(7, "alive", 1, 10_000, end=True)  # never more than it holds
    assert await counter.read(7, [1]) == {1: 0}
    await counter.give_back(7, "dead", 1, 50, end=True)  # reclaimed already: nothing twice
    assert await counter.read(7, [1]) == {1: 0}
    assert not await counter.refresh(7, "alive")


@pytestmark_db
@pytest.mark.asyncio
async def test_no_replica_says_whether_the_ready_ones_are_failing(model_version):
    """Excluded (tried) replicas are absence; replicas whose circuits are all open are failing:
    generation answers the first as capacity and the second as the replicas' fault."""
    from asgiref.sync import sync_to_async

    r1 = await sync_to_async(register_replica)(model_version, "127.0.0.1:9001")
    router = current_container().router
    with pytest.raises(NoReplicaReady) as absent:
        await router.acquire(model_version.pk, "least_outstanding_tokens", REQUEST,
                             exclude=frozenset({r1.pk}))
    assert absent.value.failing is False
    await router.state.circuit.trip(r1.pk)
    with pytest.raises(NoReplicaReady) as failing:
        await router.acquire(model_version.pk, "least_outstanding_tokens", REQUEST)
    assert failing.value.failing is True


async def _prefetch(router, model_version_id, request, policy_name=None, commands=None):
    """A snapshot queued on a pipeline of its own (as the admission's round trip carries it);
    `commands`: a list that gets the number of commands it queued."""
    redis = current_container().redis
    pipe = redis.pipeline(transaction=False)
    prefetch = router.queue_snapshot(pipe, model_version_id, await router.ready(model_version_id),
                                     request, policy_name)
    if commands is not None:
        commands.append(len(pipe.command_stack))
    await prefetch.finish(await pipe.execute(raise_on_error=False))
    return prefetch


@pytestmark_db
@pytest.mark.asyncio
async def test_a_prefetched_snapshot_spares_the_decision_its_read(model_version):
    """A snapshot read on the admission's round trip: the decision reads none of its own, and
    decisions whose snapshots were read together still spread by load (each sees the ones of
    this process that landed after its read); every prefetch is closed, used or not."""
    from asgiref.sync import sync_to_async

    ids = {(await sync_to_async(register_replica)(model_version, f"127.0.0.1:{9001 + i}")).pk
           for i in range(2)}
    router = current_container().router
    snapshots = []
    real_snapshot = router.snapshot

    async def counting_snapshot(*args, **kwargs):
        snapshots.append(1)
        return await real_snapshot(*args, **kwargs)

    router.snapshot = counting_snapshot
    try:
        requests = [RouteRequest(1, 10, 20) for _ in range(4)]
        prefetches = [await _prefetch(router, model_version.pk, r) for r in requests]
        leases = [await router.acquire(model_version.pk, "least_outstanding_tokens", r,
                                       prefetch=p) for r, p in zip(requests, prefetches)]
        assert snapshots == []  # every decision used its prefetched snapshot
        chosen = [lease.replica.replica_id for lease in leases]
        assert {rid: chosen.count(rid) for rid in ids} == {rid: 2 for rid in ids}
        # A prefetch for another request (or other replicas) is not used, but closed.
        other = await _prefetch(router, model_version.pk, REQUEST)
        lease = await router.acquire(model_version.pk, "least_outstanding_tokens",
                                     RouteRequest(1, 10, 20), prefetch=other)
        assert snapshots == [1]
        leases.append(lease)
        # One never used is closed by whoever queued it (idempotent).
        unused = await _prefetch(router, model_version.pk, REQUEST)
        unused.close()
        unused.close()
    finally:
        del router.snapshot
    assert router._deciding == []  # nothing holds the router's in-flight decisions any more
    for lease in leases:
        await lease.release()
    counter = OutstandingTokens(current_container().redis, current_container().key_prefix)
    assert await counter.read(model_version.pk, sorted(ids)) == {rid: 0 for rid in ids}


def test_a_router_makes_each_policy_once_and_follows_a_replaced_factory(monkeypatch):
    """Policies keep no state of a request: one per router and factory (not one per request);
    an unknown name gets the default's; a factory replaced in POLICIES is used from then on."""
    from inference import router as router_module

    router = router_module.Router(None, None, random.Random(0), None)
    balanced = router.policy("balanced")
    assert router.policy("balanced") is balanced
    assert router.policy("no-such-policy") is balanced  # the default, logged
    assert isinstance(router.policy("round_robin"), router_module.POLICIES["round_robin"])

    class Replacement(LeastOutstandingTokens):
        pass

    monkeypatch.setitem(router_module.POLICIES, "balanced", Replacement)
    assert isinstance(router.policy("balanced"), Replacement)


@pytestmark_db
@pytest.mark.asyncio
async def test_balanced_decided_in_redis_agrees_with_the_policy_on_live_state(model_version):
    """`balanced` is decided in Redis with its lease (inference/routing_decision.py, Lua): on
    random loads, prefixes and KV signals it picks what `Balanced.choose` picks on the same
    state, and holds the prompt it misses there plus the output."""
    from asgiref.sync import sync_to_async

    from inference.policies import Balanced

    replicas = [replica((await sync_to_async(register_replica)(
        model_version, f"127.0.0.1:{9001 + i}")).pk) for i in range(3)]
    router = current_container().router
    counter, index = router._counter, router.state.prefix_index
    policy = router.policy("balanced")
    assert isinstance(policy, Balanced)
    rng = random.Random(7)
    mv = model_version.pk
    for case in range(120):
        prompt = rng.randint(1, 300)
        request = RouteRequest(1, prompt, rng.randint(1, 64),
                               block_hashes=tuple(rng.getrandbits(62) for _ in range(prompt // 16)))
        loads, blocks, candidates = {}, {}, []
        for r in replicas:
            rid = r.replica_id
            loads[rid] = rng.choice([0, 0, rng.randint(0, 400)])
            blocks[rid] = rng.randint(0, len(request.block_hashes))
            if loads[rid]:
                await counter.add(mv, rid, loads[rid])
            if blocks[rid]:
                await index.record(mv, request.block_hashes[:blocks[rid]], rid)
            free = rng.choice([None, rng.randint(0, 40)])
            uncached = None if free is None else rng.choice([None, rng.randint(0, free)])
            candidates.append(Candidate(r, 0, kv_free_blocks=free, kv_free_uncached_blocks=uncached))
        live = [Candidate(c.replica, loads[c.replica.replica_id],
                          prefix_blocks=blocks[c.replica.replica_id],
                          kv_free_blocks=c.kv_free_blocks,
                          kv_free_uncached_blocks=c.kv_free_uncached_blocks) for c in candidates]
        expected = policy.choose(request, live)
        lease = await router._decide_in_redis(mv, policy, request,
                                              policy.tie_order(request, candidates), set())
        assert lease.replica.replica_id == expected.replica.replica_id, case
        assert lease.num_prompt_tokens == prompt - expected.hit_tokens(request), case
        assert lease.held_tokens == lease.num_prompt_tokens + request.max_tokens
        await lease.release()
        for rid, load in loads.items():
            if load:
                await counter.add(mv, rid, -load)
    ids = [r.replica_id for r in replicas]
    assert await counter.read(mv, ids) == {rid: 0 for rid in ids}


@pytestmark_db
@pytest.mark.asyncio
async def test_two_processes_deciding_at_once_spread_new_prefixes_evenly(model_version):
    """Two API processes (two routers on one Redis) route twelve new prefixes at once, each
    decision on a snapshot read earlier (the admission's round trip), reads and leases
    interleaved at random: with `balanced` decided in Redis every interleaving ends 4 / 4 / 4.
    Decided on the snapshots, a process that had seen some of the other's leases made up for
    them while the other went on without seeing its own (5 / 4 / 3 and worse)."""
    from asgiref.sync import sync_to_async

    from inference.router import Router

    ids = sorted([(await sync_to_async(register_replica)(
        model_version, f"127.0.0.1:{9001 + i}")).pk for i in range(3)])
    first = current_container().router
    second = Router(first._directory, first._counter, random.Random(1), first.state)
    rng = random.Random(3)
    for trial in range(12):
        requests = [RouteRequest(1, 100, 20, block_hashes=(rng.getrandbits(62),
                                                           rng.getrandbits(62)))
                    for _ in range(12)]
        routers = [first, second] * 6
        events = [("read", i) for i in range(12)] + [("lease", i) for i in range(12)]
        rng.shuffle(events)
        read, prefetches, leases = set(), {}, []
        while events:  # a lease only after its own snapshot's read
            event = next(e for e in events if e[0] == "read" or e[1] in read)
            events.remove(event)
            kind, i = event
            if kind == "read":
                prefetches[i] = await _prefetch(routers[i], model_version.pk, requests[i])
                read.add(i)
            else:
                leases.append(await routers[i].acquire(model_version.pk, "balanced",
                                                       requests[i], prefetch=prefetches[i]))
        chosen = [lease.replica.replica_id for lease in leases]
        assert sorted(chosen.count(rid) for rid in ids) == [4, 4, 4], (trial, chosen)
        for lease in leases:
            await lease.release()
    assert await first._counter.read(model_version.pk, ids) == {rid: 0 for rid in ids}


@pytestmark_db
@pytest.mark.asyncio
async def test_a_snapshot_for_a_decision_in_redis_skips_the_live_reads(model_version):
    """Read for `balanced` (decided in Redis), the admission's snapshot leaves out the
    outstanding tokens and the prefix match (two scripts fewer on that round trip) and the
    decision still reads none of its own; a policy that chooses on the snapshot does not take
    such a snapshot: it reads a whole one."""
    from asgiref.sync import sync_to_async

    for i in range(2):
        await sync_to_async(register_replica)(model_version, f"127.0.0.1:{9001 + i}")
    router = current_container().router
    request = RouteRequest(1, 100, 20, block_hashes=(1, 2, 3, 4, 5, 6))
    whole, lean = [], []
    (await _prefetch(router, model_version.pk, request, "least_outstanding_tokens",
                     whole)).close()
    snapshots = []
    real_snapshot = router.snapshot

    async def counting_snapshot(*args, **kwargs):
        snapshots.append(kwargs.get("live", True))
        return await real_snapshot(*args, **kwargs)

    router.snapshot = counting_snapshot
    try:
        prefetch = await _prefetch(router, model_version.pk, request, "balanced", lean)
        assert lean[0] == whole[0] - 2
        first = await router.acquire(model_version.pk, "balanced", request, prefetch=prefetch)
        assert snapshots == []
        await first.release()  # else its 120 tokens outweigh the prefix (the load guard)
        again = await router.acquire(model_version.pk, "balanced", request,
                                     prefetch=await _prefetch(router, model_version.pk,
                                                              request, "balanced"))
        assert snapshots == []
        # The prefix is read in Redis as it decides: the same replica, 6 blocks expected cached.
        assert again.replica.replica_id == first.replica.replica_id
        assert (first.num_prompt_tokens, again.num_prompt_tokens) == (100, 100 - 6 * 16)
        other = await router.acquire(model_version.pk, "least_outstanding_tokens", request,
                                     prefetch=await _prefetch(router, model_version.pk,
                                                              request, "balanced"))
        assert snapshots == [True]
    finally:
        del router.snapshot
    assert router._deciding == []
    for lease in (first, again, other):
        await lease.release()
