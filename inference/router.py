"""The router: which ready replica of a model version serves a request.

A policy is one pure function of a snapshot, `choose(request, candidates) -> candidate`,
registered by name in POLICIES (issue 5 adds more). The live signal here is each replica's
outstanding tokens (prompt not yet prefilled + output still allowed), kept in one Redis hash
per model version so every platform process sees the same load.

Invariant: every `acquire` is matched by exactly one `Lease.release`, which returns all the
tokens the lease still holds; counts therefore return to zero when the fleet is idle.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Protocol

from models_registry.selectors import ReplicaInfo, ServingVersion, ready_replicas, serving_version


@dataclass(frozen=True)
class RouteRequest:
    tenant_id: int
    num_prompt_tokens: int
    max_tokens: int

    @property
    def cost_tokens(self) -> int:
        return self.num_prompt_tokens + self.max_tokens


@dataclass(frozen=True)
class Candidate:
    replica: ReplicaInfo
    outstanding_tokens: int


class RoutingPolicy(Protocol):
    name: str

    def choose(self, request: RouteRequest, candidates: list[Candidate]) -> Candidate:
        """Pick one of `candidates` (never empty); must not mutate them."""


class LeastOutstandingTokens:
    """The candidate with the fewest outstanding tokens; ties broken at random so concurrent
    requests from several processes do not all land on the same idle replica."""

    name = "least_outstanding_tokens"

    def __init__(self, rng: random.Random):
        self._rng = rng

    def choose(self, request: RouteRequest, candidates: list[Candidate]) -> Candidate:
        least = min(c.outstanding_tokens for c in candidates)
        return self._rng.choice([c for c in candidates if c.outstanding_tokens == least])


POLICIES: dict[str, Callable[[random.Random], RoutingPolicy]] = {
    LeastOutstandingTokens.name: LeastOutstandingTokens,
}


class NoReplicaReady(Exception):
    pass


class OutstandingTokens:
    """Per-replica outstanding token counts in a Redis hash per model version."""

    def __init__(self, redis, key_prefix: str):
        self._redis = redis
        self._prefix = key_prefix

    def key(self, model_version_id: int) -> str:
        return f"{self._prefix}outstanding:{model_version_id}"

    async def read(self, model_version_id: int, replica_ids: list[int]) -> dict[int, int]:
        values = await self._redis.hmget(self.key(model_version_id), [str(i) for i in replica_ids])
        return {rid: int(v or 0) for rid, v in zip(replica_ids, values)}

    async def add(self, model_version_id: int, replica_id: int, num_tokens: int) -> None:
        if num_tokens:
            await self._redis.hincrby(self.key(model_version_id), str(replica_id), num_tokens)


@dataclass
class Lease:
    """Tokens a request holds on a replica; release in two steps (prompt, then the rest)."""

    replica: ReplicaInfo
    model_version_id: int
    counter: OutstandingTokens
    num_prompt_tokens: int
    held_tokens: int
    prompt_released: bool = field(default=False)

    async def release_prompt(self) -> None:
        """The prompt is prefilled (first token seen): it no longer loads the replica."""
        if not self.prompt_released and self.held_tokens:
            self.prompt_released = True
            self.held_tokens -= self.num_prompt_tokens
            await self.counter.add(self.model_version_id, self.replica.replica_id,
                                   -self.num_prompt_tokens)

    async def release(self) -> None:
        held, self.held_tokens = self.held_tokens, 0
        await self.counter.add(self.model_version_id, self.replica.replica_id, -held)


class ReplicaDirectory:
    """Ready replicas per model version, read from PostgreSQL at most every `ttl_seconds`."""

    def __init__(self, clock: Callable[[], float], ttl_seconds: float):
        self._clock = clock
        self._ttl = ttl_seconds
        self._cached: dict[int, tuple[float, list[ReplicaInfo]]] = {}

    async def ready(self, model_version_id: int) -> list[ReplicaInfo]:
        now = self._clock()
        hit = self._cached.get(model_version_id)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        replicas = await ready_replicas(model_version_id)
        self._cached[model_version_id] = (now, replicas)
        return replicas


class ServingCatalog:
    """`serving_version` per (model, tenant), read from PostgreSQL at most every `ttl_seconds`."""

    def __init__(self, clock: Callable[[], float], ttl_seconds: float):
        self._clock = clock
        self._ttl = ttl_seconds
        self._cached: dict[tuple[str, int], tuple[float, ServingVersion | None]] = {}

    async def get(self, model_name: str, tenant_id: int) -> ServingVersion | None:
        now = self._clock()
        key = (model_name, tenant_id)
        hit = self._cached.get(key)
        if hit is not None and now - hit[0] < self._ttl:
            return hit[1]
        target = await serving_version(model_name, tenant_id)
        if len(self._cached) > 10_000:  # bound memory under many tenants x models
            self._cached.clear()
        self._cached[key] = (now, target)
        return target


class Router:
    def __init__(self, directory: ReplicaDirectory, counter: OutstandingTokens, rng: random.Random):
        self._directory = directory
        self._counter = counter
        self._rng = rng

    async def num_ready(self, model_version_id: int) -> int:
        return len(await self._directory.ready(model_version_id))

    def policy(self, name: str) -> RoutingPolicy:
        factory = POLICIES.get(name, LeastOutstandingTokens)
        return factory(self._rng)

    async def acquire(self, model_version_id: int, policy_name: str, request: RouteRequest,
                      exclude: frozenset[int] = frozenset()) -> Lease:
        replicas = [r for r in await self._directory.ready(model_version_id)
                    if r.replica_id not in exclude]
        if not replicas:
            raise NoReplicaReady()
        loads = await self._counter.read(model_version_id, [r.replica_id for r in replicas])
        candidates = [Candidate(r, loads[r.replica_id]) for r in replicas]
        chosen = self.policy(policy_name).choose(request, candidates)
        await self._counter.add(model_version_id, chosen.replica.replica_id, request.cost_tokens)
        return Lease(
            replica=chosen.replica,
            model_version_id=model_version_id,
            counter=self._counter,
            num_prompt_tokens=request.num_prompt_tokens,
            held_tokens=request.cost_tokens,
        )
