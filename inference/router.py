"""The router: which ready replica of a model version serves a request.

`Router.acquire` builds a snapshot and asks the model's policy (inference/policies.py, pure
functions registered by name) to choose; `balanced` (the default) is chosen in Redis instead,
by a Lua script that reads the live outstanding tokens and prefix index as it takes the lease
(inference/routing_decision.py), so that API processes deciding at once agree. The live signals, all shared in
Redis by every platform process:
- outstanding tokens per replica: what the platform has sent and not yet seen done (prompt
  tokens not expected from the prefix cache, until the first token; output still allowed);
- the replica's own metrics (free KV blocks, waiting sequences), polled about every second
  (inference/replica_signals.py), absent when stale;
- the prefix index (inference/prefix_index.py): leading prompt blocks each replica recently got;
- the circuit breaker per replica (inference/circuit.py): open circuits get nothing; a
  half-open one gets exactly one request (the half-open trial), ahead of the policy.
A replica whose engine died (`dead`) is dropped at once: its circuit trips open (every platform
process), this process forgets it, and the registry marks it failed (fleet/health_check.py).
Only `ready` replicas are candidates (the registry's state; a draining replica finishes its
streams but gets nothing new).

Invariant: every `acquire` is matched by exactly one `Lease.release`, which returns all the
tokens the lease still holds; counts therefore return to zero when the fleet is idle.
"""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass, field, replace
from typing import Callable

from common.random_ids import random_hex
from common import pipelines
from common.ttl_cache import TtlCache
from inference.circuit import HALF_OPEN, OPEN, CircuitBreaker
from inference.db_connection import registry_cache
from inference.hooks import engine_died
from inference.outstanding_tokens import OutstandingTokens  # noqa: F401 - also re-exported
from inference.policies import (  # noqa: F401 - re-exported: the router's public names
    DEFAULT_POLICY,
    POLICIES,
    Candidate,
    LeastOutstandingTokens,
    RouteRequest,
    RoutingPolicy,
)
from inference.prefix_index import PrefixIndex
from inference.replica_signals import SignalPoller, SignalStore
from inference.routing_decision import RedisDecision
from inference.routing_stats import RoutingStats
from models_registry.selectors import ReplicaInfo, ServingVersion, ready_replicas, serving_version
from common import redis_keys

logger = logging.getLogger(__name__)


class NoReplicaReady(Exception):
    """No replica can take the request. `failing`: ready replicas exist but every circuit is
    open (they are failing, not busy or absent)."""

    def __init__(self, failing: bool = False):
        super().__init__("every ready replica's circuit is open" if failing else
                         "no ready replica")
        self.failing = failing


@dataclass
class Lease:
    """Tokens a request holds on a replica; release in two steps (prompt, then the rest).
    The tokens are an expiring lease in Redis (`OutstandingTokens`): `refresh` keeps it."""

    replica: ReplicaInfo
    model_version_id: int
    counter: OutstandingTokens
    num_prompt_tokens: int  # prompt tokens charged (those not expected from the prefix cache)
    held_tokens: int
    prompt_released: bool = field(default=False)
    policy: str = ""
    block_hashes: tuple[int, ...] = ()
    is_half_open_trial: bool = False  # the half-open circuit's single trial request
    # The replica's circuit had no state when it was chosen (no failure since the last
    # success): its first token has nothing to reset (`Router.first_token` skips Redis).
    circuit_clean: bool = False
    lease_id: str = field(default_factory=random_hex)

    async def release_prompt(self) -> None:
        """The prompt is prefilled (first token seen): it no longer loads the replica."""
        if not self.prompt_released and self.held_tokens:
            self.prompt_released = True
            self.held_tokens -= self.num_prompt_tokens
            await self.counter.give_back(self.model_version_id, self.lease_id,
                                         self.replica.replica_id, self.num_prompt_tokens)

    async def release(self) -> None:
        held, self.held_tokens = self.held_tokens, 0
        if held:
            await self.counter.give_back(self.model_version_id, self.lease_id,
                                         self.replica.replica_id, held, end=True)

    def queue_release(self, batch) -> None:
        """`release` queued on a `common.pipelines.Batch` (the request's end)."""
        held, self.held_tokens = self.held_tokens, 0
        if held:
            self.counter.queue_end(batch, self.model_version_id, self.lease_id,
                                   self.replica.replica_id, held)

    async def refresh(self) -> bool:
        return await self.counter.refresh(self.model_version_id, self.lease_id)


async def _release_quietly(lease: Lease) -> None:
    try:
        await lease.release()
    except Exception:  # noqa: BLE001 - the lease expires instead
        logger.warning("lease %s not released; it expires", lease.lease_id)


def _log_failures(what: str):
    """A Batch `finish` that only logs the first failure among its results."""
    async def finish(results: list) -> None:
        failure = next((r for r in results if isinstance(r, BaseException)), None)
        if failure is not None:
            logger.warning("%s not recorded (%r); what it held expires", what, failure)
    return finish


class ReplicaDirectory:
    """Ready replicas per model version, read from PostgreSQL at most every `ttl_seconds`
    (reloaded ahead: inference.db_connection.registry_cache)."""

    def __init__(self, clock: Callable[[], float], ttl_seconds: float):
        self._cache: TtlCache[int, list[ReplicaInfo]] = registry_cache(
            ready_replicas, clock, ttl_seconds)

    async def ready(self, model_version_id: int) -> list[ReplicaInfo]:
        return await self._cache.get(model_version_id)

    def drop(self, model_version_id: int, replica_id: int) -> None:
        """Forget a replica known broken until the next read from PostgreSQL."""
        self._cache.update(model_version_id,
                           lambda replicas: [r for r in replicas if r.replica_id != replica_id])


class ServingCatalog:
    """`serving_version` per (model, tenant), read from PostgreSQL at most every `ttl_seconds`
    (reloaded ahead: inference.db_connection.registry_cache)."""

    def __init__(self, clock: Callable[[], float], ttl_seconds: float):
        self._cache: TtlCache[tuple[str, int], ServingVersion | None] = registry_cache(
            lambda key: serving_version(*key), clock, ttl_seconds)

    async def get(self, model_name: str, tenant_id: int) -> ServingVersion | None:
        return await self._cache.get((model_name, tenant_id))


@dataclass(eq=False)  # identity: two equal decisions are still two
class _Inflight:
    """A decision of this process whose lease is on its way to Redis (`landed`: None), or
    landed at that epoch of the router's writes."""

    model_version_id: int
    replica_id: int
    tokens: int
    block_hashes: tuple[int, ...]
    landed: int | None = None

    def shared_blocks(self, block_hashes: tuple[int, ...]) -> int:
        """Leading blocks of `block_hashes` this decision sends to its replica."""
        n = 0
        for mine, theirs in zip(self.block_hashes, block_hashes):
            if mine != theirs:
                break
            n += 1
        return n


class Prefetch:
    """A routing snapshot read on another call's round trip (the admission's, which comes just
    before routing): `Router.queue_snapshot` queues its reads on that pipeline, `finish` parses
    its results, and `Router.acquire(..., prefetch=)` decides on it instead of reading its own
    snapshot, one round trip fewer. It counts as a running decision of its router from the
    moment it is queued (the router's decisions landing after that are added to it, as to any
    snapshot) until `close` (idempotent: whoever queued it closes it, used or not)."""

    def __init__(self, router: "Router", model_version_id: int, replica_ids: tuple[int, ...],
                 request: "RouteRequest", epoch: int):
        self._router = router
        self.model_version_id = model_version_id
        self.replica_ids = replica_ids
        self.request = request
        self.epoch = epoch
        self.snapshot = None  # (request, candidates, circuits, clean) once parsed
        self._parse = None
        self._open = True
        self.live = True  # read with the outstanding tokens and prefix index (queue_snapshot)

    async def finish(self, results: list) -> None:
        """The pipeline's results for the commands this snapshot queued (or [exception])."""
        if self._parse is None or any(isinstance(r, BaseException) for r in results):
            return  # a failed read (NOSCRIPT, Redis): acquire reads its own snapshot
        try:
            self.snapshot = self._parse(results)
        except Exception:  # noqa: BLE001 - unreadable: acquire reads its own
            logger.warning("prefetched routing snapshot unreadable; reading again",
                           exc_info=True)

    def close(self) -> None:
        if self._open:
            self._open = False
            self._router._decided(self.epoch)


@dataclass
class RoutingState:
    """The router's shared state in Redis."""

    redis: object
    key_prefix: str
    prefix_index: PrefixIndex
    signals: SignalStore
    circuit: CircuitBreaker
    stats: RoutingStats

    def sequence_key(self, model_version_id: int) -> str:
        return redis_keys.route_sequence(self.key_prefix, model_version_id)


class Router:
    """Decisions take no lock: each reads its snapshot in one pipelined round trip and takes
    its lease (outstanding tokens, prefix index, counters) in one more. Requests of this
    process decided while another's lease is on its way to Redis see it anyway: the tokens and
    prompt blocks chosen and not yet written are kept in memory (`_inflight`) and added to
    every snapshot until the write lands, so requests arriving together do not all read the
    same loads and pile onto one replica. Across processes the shared state is Redis itself,
    one round trip stale at most; a policy that `decides_in_redis` (`balanced`) is not stale at
    all: its choice is made in Redis with the lease (inference/routing_decision.py), in Redis's order of every process's
    decisions."""

    def __init__(self, directory: ReplicaDirectory, counter: OutstandingTokens, rng: random.Random,
                 state: RoutingState, poller: SignalPoller | None = None):
        self._directory = directory
        self._counter = counter
        self._rng = rng
        self.state = state
        self._poller = poller
        self._inflight: list[_Inflight] = []
        self._policies: dict[Callable, RoutingPolicy] = {}  # by factory (POLICIES' values)
        self._epoch = 0
        self._deciding: list[int] = []  # the epoch each running decision started at
        self._decision: RedisDecision | None = None

    async def num_ready(self, model_version_id: int) -> int:
        return len(await self._directory.ready(model_version_id))

    def policy(self, name: str) -> RoutingPolicy:
        """The policy `name`, made once per router and factory (policies keep no state of a
        request)."""
        factory = POLICIES.get(name)
        if factory is None:  # the admin validates names; an old row may still hold another
            logger.warning("unknown routing policy %r: using %s", name, DEFAULT_POLICY)
            factory = POLICIES[DEFAULT_POLICY]
        policy = self._policies.get(factory)
        if policy is None:
            policy = self._policies[factory] = factory(self._rng)
        return policy

    def _queue_snapshot(self, pipe, model_version_id: int, replicas: list[ReplicaInfo],
                        request: RouteRequest, live: bool = True):
        """Queue a snapshot's reads on `pipe`; returns the parser of their results (a list,
        in order) into (request with its sequence, candidates, circuits, clean circuits).
        `live` False: without the outstanding tokens and the prefix index (0 in the
        candidates), for a policy that reads them in Redis as it decides."""
        ids = [r.replica_id for r in replicas]
        pipe.execute_command("INCRBY", self.state.sequence_key(model_version_id), 1)
        if live:
            self._counter.queue_read(pipe, model_version_id, ids)
        parse_signals = self.state.signals.queue_read(pipe, ids)
        if live:
            parse_prefix = self.state.prefix_index.queue_match(pipe, model_version_id,
                                                               request.block_hashes, ids)
        parse_circuits = self.state.circuit.queue_states(pipe, ids)

        def parse(raw: list):
            results = iter(raw)
            sequence = next(results)
            if live:
                loads = self._counter.parse_read(ids, next(results))
                signals, prefix = parse_signals(results), parse_prefix(results)
            else:
                signals = parse_signals(results)
                loads = prefix = dict.fromkeys(ids, 0)
            circuits = parse_circuits(results)
            candidates = []
            for r in replicas:
                s = signals.get(r.replica_id)
                candidates.append(Candidate(
                    r, loads[r.replica_id], prefix_blocks=prefix[r.replica_id],
                    kv_free_blocks=s.kv_free_blocks if s else None,
                    kv_free_uncached_blocks=s.kv_free_uncached_blocks if s else None,
                    kv_total_blocks=s.kv_total_blocks if s else None,
                    waiting_seqs=s.waiting_seqs if s else None))
            return RouteRequest(request.tenant_id, request.num_prompt_tokens, request.max_tokens,
                                request.block_hashes, sequence), candidates, circuits, \
                parse_circuits.clean
        return parse

    async def snapshot(self, model_version_id: int, replicas: list[ReplicaInfo],
                       request: RouteRequest, live: bool = True
                       ) -> tuple[RouteRequest, list[Candidate], dict[int, str], set[int]]:
        """Everything a decision reads, in one round trip: the round-robin sequence, the
        outstanding tokens, the replicas' signals, the prefix index and the circuits
        (`live` False: as `_queue_snapshot`)."""
        raw, parse = await pipelines.execute(
            self.state.redis,
            lambda pipe: self._queue_snapshot(pipe, model_version_id, replicas, request, live),
            self._scripts())
        return parse(raw)

    def _scripts(self) -> tuple:
        """The Lua scripts the snapshot and the lease queue (loaded again on NOSCRIPT)."""
        return (*self._counter.scripts, *self.state.prefix_index.scripts)

    @property
    def _redis_decision(self) -> RedisDecision:
        if self._decision is None:  # made on first use (a router of a test may have no state)
            self._decision = RedisDecision(self.state.redis, self._counter,
                                           self.state.prefix_index, self.state.stats)
        return self._decision

    async def ready(self, model_version_id: int) -> list[ReplicaInfo]:
        return await self._directory.ready(model_version_id)

    def queue_snapshot(self, pipe, model_version_id: int, replicas: list[ReplicaInfo],
                       request: RouteRequest, policy_name: str | None = None) -> Prefetch:
        """A snapshot for the next `acquire` of this request, read on `pipe` (another call's
        round trip); `replicas`: the version's ready replicas now (`ready`); `policy_name`:
        the policy that will decide (one that decides in Redis needs no live reads here).
        Await the returned prefetch's `finish` with those commands' results, and `close` it."""
        prefetch = Prefetch(self, model_version_id, tuple(r.replica_id for r in replicas),
                            request, self._epoch)
        prefetch.live = not (policy_name is not None and self._in_redis(policy_name))
        self._deciding.append(prefetch.epoch)
        if replicas:
            prefetch._parse = self._queue_snapshot(pipe, model_version_id, replicas, request,
                                                   prefetch.live)
        return prefetch

    def _in_redis(self, policy_name: str) -> bool:
        return getattr(self.policy(policy_name), "decides_in_redis", False)

    def _decided(self, epoch: int) -> None:
        self._deciding.remove(epoch)
        self._prune()

    async def acquire(self, model_version_id: int, policy_name: str, request: RouteRequest,
                      exclude: frozenset[int] = frozenset(),
                      prefetch: Prefetch | None = None) -> Lease:
        """`prefetch`: a snapshot of this request read just before (`queue_snapshot`), used
        when it was read for these very replicas and request; closed here in any case."""
        try:
            ready = await self._directory.ready(model_version_id)
        except BaseException:
            if prefetch is not None:
                prefetch.close()
            raise
        if self._poller is not None:
            self._poller.watch(ready)
        replicas = [r for r in ready if r.replica_id not in exclude]
        policy = self.policy(policy_name)
        in_redis = getattr(policy, "decides_in_redis", False)
        usable = (prefetch is not None and prefetch.snapshot is not None
                  and prefetch.model_version_id == model_version_id
                  and prefetch.request is request
                  and (prefetch.live or in_redis)
                  and prefetch.replica_ids == tuple(r.replica_id for r in replicas))
        if prefetch is not None and not usable:
            prefetch.close()
        if not replicas:
            raise NoReplicaReady()
        if usable:
            start = prefetch.epoch  # registered as deciding since it was queued
        else:
            start = self._epoch
            self._deciding.append(start)
        try:
            if usable:
                request, candidates, circuits, clean = prefetch.snapshot
            else:
                request, candidates, circuits, clean = await self.snapshot(
                    model_version_id, replicas, request, live=not in_redis)
            for c in candidates:
                rid = c.replica.replica_id
                if circuits[rid] == HALF_OPEN and await self.state.circuit.try_half_open_trial(rid):
                    return await self._lease(model_version_id, policy_name, request,
                                             Candidate(c.replica, 0), is_half_open_trial=True)
            candidates = [c for c in candidates
                          if circuits[c.replica.replica_id] not in (OPEN, HALF_OPEN)]
            if not candidates:
                raise NoReplicaReady(failing=True)
            if in_redis:  # one candidate too: Redis reads its prefix match (the tokens held)
                candidates = policy.tie_order(request, candidates)
            else:
                if len(candidates) > 1:
                    candidates = self._with_inflight(model_version_id, request, candidates,
                                                     start)
                chosen = policy.choose(request, candidates)
        finally:
            if usable:
                prefetch.close()
            else:
                self._decided(start)
        if in_redis:
            return await self._decide_in_redis(model_version_id, policy, request, candidates,
                                               clean)
        return await self._lease(model_version_id, policy_name, request, chosen,
                                 circuit_clean=chosen.replica.replica_id in clean)

    async def _decide_in_redis(self, model_version_id: int, policy, request: RouteRequest,
                               candidates: list[Candidate], clean: set[int]) -> Lease:
        """The policy's choice made in Redis with its lease (inference/routing_decision.py;
        `candidates` in the policy's tie order). No in-flight entry is kept: this process's
        decisions queued before it run before it, on the one connection, and those after it
        see it in Redis."""
        replica_id, lease_id, held = await self._redis_decision.take(
            model_version_id, policy, request, candidates)
        chosen = next(c.replica for c in candidates if c.replica.replica_id == replica_id)
        return Lease(
            replica=chosen, model_version_id=model_version_id, counter=self._counter,
            num_prompt_tokens=held - request.max_tokens, held_tokens=held, policy=policy.name,
            block_hashes=request.block_hashes,
            circuit_clean=replica_id in clean, lease_id=lease_id)

    def _prune(self) -> None:
        oldest = min(self._deciding, default=self._epoch)
        self._inflight = [i for i in self._inflight if i.landed is None or i.landed > oldest]

    def _with_inflight(self, model_version_id: int, request: RouteRequest,
                       candidates: list[Candidate], start: int) -> list[Candidate]:
        """The snapshot plus this process's decisions its read may have missed."""
        mine = [i for i in self._inflight if i.model_version_id == model_version_id
                and (i.landed is None or i.landed > start)]
        if not mine:
            return candidates
        out = []
        for c in candidates:
            rid = c.replica.replica_id
            extra = sum(i.tokens for i in mine if i.replica_id == rid)
            blocks = max([c.prefix_blocks] + [i.shared_blocks(request.block_hashes)
                                              for i in mine if i.replica_id == rid])
            out.append(replace(c, outstanding_tokens=c.outstanding_tokens + extra,
                               prefix_blocks=blocks))
        return out

    async def _lease(self, model_version_id: int, policy_name: str, request: RouteRequest,
                     chosen: Candidate, is_half_open_trial: bool = False,
                     circuit_clean: bool = False) -> Lease:
        replica_id = chosen.replica.replica_id
        prompt = request.num_prompt_tokens - chosen.hit_tokens(request)
        lease = Lease(
            replica=chosen.replica,
            model_version_id=model_version_id,
            counter=self._counter,
            num_prompt_tokens=prompt,
            held_tokens=prompt + request.max_tokens,
            policy=policy_name,
            block_hashes=request.block_hashes,
            is_half_open_trial=is_half_open_trial,
            circuit_clean=circuit_clean,
        )
        inflight = _Inflight(model_version_id, replica_id, lease.held_tokens,
                             request.block_hashes)
        self._inflight.append(inflight)  # before any await: the next decision sees it
        try:
            def build(pipe):  # one round trip: the tokens, the prefix index, the counters
                self._counter.queue_hold(pipe, model_version_id, lease.lease_id, replica_id,
                                         lease.held_tokens)
                self.state.prefix_index.queue_record(pipe, model_version_id,
                                                     request.block_hashes, replica_id)
                self.state.stats.queue_add(pipe, model_version_id, replica_id, policy_name,
                                           routed=1)

            await pipelines.execute(self.state.redis, build, self._scripts())
        except BaseException:  # the caller never sees this lease: give its tokens back here
            self._inflight.remove(inflight)
            await asyncio.shield(_release_quietly(lease))
            raise
        self._epoch += 1
        inflight.landed = self._epoch
        self._prune()
        return lease

    # ---- outcomes (inference/generation.py reports them) ---------------------------------------

    async def first_token(self, lease: Lease) -> None:
        """A success resets the replica's circuit; one that had no state when the request was
        routed has nothing to reset (no round trip: a failure recorded since then by another
        request is reset by the next success routed after it)."""
        if lease.circuit_clean:
            return
        await self.state.circuit.record_success(lease.replica.replica_id)

    async def failed(self, lease: Lease, *, before_first_token: bool, retrying: bool) -> None:
        """A replica fault: counts toward its circuit; before the first token the replica
        computed nothing we can count on, so the prefix index forgets this prompt there."""
        rid = lease.replica.replica_id
        opened = await self.state.circuit.record_failure(rid)
        await self.state.stats.add(lease.model_version_id, rid, lease.policy, failures=1,
                                   retries=int(retrying), circuit_opened=int(opened))
        if before_first_token:
            await self.state.prefix_index.forget(lease.model_version_id, lease.block_hashes, rid)

    async def dead(self, lease: Lease, reason: str) -> None:
        """The replica's engine died: no request goes there any more, from any process."""
        rid = lease.replica.replica_id
        self._directory.drop(lease.model_version_id, rid)
        await self.state.circuit.trip(rid)
        await self.state.stats.add(lease.model_version_id, rid, lease.policy, failures=1, circuit_opened=1)
        await self.state.prefix_index.forget(lease.model_version_id, lease.block_hashes, rid)
        answers = await engine_died.asend(sender=Router, replica_id=rid, reason=reason)
        if any(marked is True for _, marked in answers):
            logger.error("replica %s: engine died (%s); marked failed", rid, reason)

    def queue_finished(self, batch, lease: Lease, num_prompt_tokens: int,
                       num_cached_tokens: int):
        """A request served to its end, queued on a `common.pipelines.Batch` with the rest of
        the request's end: the lease's release (its tokens; on failure it expires) and the
        routing counters (on failure they miss this request)."""
        lease.queue_release(batch)
        self.state.stats.queue_add(batch.pipe, lease.model_version_id, lease.replica.replica_id,
                                   lease.policy, prompt_tokens=num_prompt_tokens,
                                   hit_tokens=num_cached_tokens)
        return _log_failures(f"routing end of lease {lease.lease_id}")
