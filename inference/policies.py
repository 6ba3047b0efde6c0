"""Routing policies: pure functions of a snapshot, `choose(request, candidates) -> candidate`.

A snapshot is the request (`RouteRequest`: its size and the chained hashes of its leading
prompt blocks) and one `Candidate` per routable replica (the platform's outstanding tokens on
it, what it last reported on its metrics port, and how many of the request's leading blocks the
prefix index says it holds). Policies read nothing else: no clock, no Redis, no global state,
so a fixed snapshot gives an exact choice (tests/platform/test_routing_policies.py).

Invariants: `candidates` is never empty and is not mutated; the result is one of them.
Ties are broken by rendezvous hashing of the request's first block hash (or its sequence
number when the prompt has no full block), which is deterministic and still spreads different
prefixes, and successive short requests, over the replicas.
"""
from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass
from typing import Callable, Protocol

from models_registry.selectors import ReplicaInfo
from replica.engine.config import EngineConfig

# The engine's KV block size (tokens per block): prefix hashes only agree if it is the same.
BLOCK_SIZE = EngineConfig(model_path="").block_size


@dataclass(frozen=True)
class RouteRequest:
    tenant_id: int
    num_prompt_tokens: int
    max_tokens: int
    # Chained hashes of the prompt's leading full blocks (inference/prefix_index.py).
    block_hashes: tuple[int, ...] = ()
    # A per-model-version counter shared by every process (round robin's cursor).
    sequence: int = 0

    @property
    def cost_tokens(self) -> int:
        return self.num_prompt_tokens + self.max_tokens

    @property
    def num_blocks_needed(self) -> int:
        return math.ceil(self.cost_tokens / BLOCK_SIZE)


@dataclass(frozen=True)
class Candidate:
    replica: ReplicaInfo
    outstanding_tokens: int
    # Leading blocks of this request the replica recently received (the prefix index).
    prefix_blocks: int = 0
    # From the replica's metrics port; None when unknown or stale.
    kv_free_blocks: int | None = None  # cached prefixes included (taking those evicts them)
    kv_free_uncached_blocks: int | None = None  # free without evicting a cached prefix
    kv_total_blocks: int | None = None
    waiting_seqs: int | None = None

    def hit_tokens(self, request: RouteRequest) -> int:
        """Prompt tokens this replica is expected to serve from its prefix cache (the engine
        always computes at least the last prompt token)."""
        return max(0, min(self.prefix_blocks * BLOCK_SIZE, request.num_prompt_tokens - 1))


class RoutingPolicy(Protocol):
    name: str

    def choose(self, request: RouteRequest, candidates: list[Candidate]) -> Candidate:
        """Pick one of `candidates` (never empty); must not mutate them."""


def rendezvous_weight(key: int, replica_id: int) -> int:
    digest = hashlib.blake2b(f"{key}:{replica_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _tie_key(request: RouteRequest) -> int:
    return request.block_hashes[0] if request.block_hashes else request.sequence


def best(request: RouteRequest, candidates: list[Candidate],
         score: Callable[[Candidate], float]) -> Candidate:
    """The candidate with the lowest score; ties go to the highest rendezvous weight."""
    key = _tie_key(request)
    return min(candidates, key=lambda c: (score(c), -rendezvous_weight(key, c.replica.replica_id)))


class RoundRobin:
    """The baseline: replicas in id order, one after the other (the cursor is the request's
    shared sequence number, so every process takes the next one)."""

    name = "round_robin"

    def __init__(self, rng: random.Random):
        pass

    def choose(self, request: RouteRequest, candidates: list[Candidate]) -> Candidate:
        ordered = sorted(candidates, key=lambda c: c.replica.replica_id)
        return ordered[request.sequence % len(ordered)]


class LeastOutstandingTokens:
    """The candidate with the fewest outstanding tokens; ties broken at random so concurrent
    requests from several processes do not all land on the same idle replica."""

    name = "least_outstanding_tokens"

    def __init__(self, rng: random.Random):
        self._rng = rng

    def choose(self, request: RouteRequest, candidates: list[Candidate]) -> Candidate:
        least = min(c.outstanding_tokens for c in candidates)
        return self._rng.choice([c for c in candidates if c.outstanding_tokens == least])


class PrefixAffinity:
    """The replica holding the longest prefix of the request; a new prefix goes where
    rendezvous hashing of its first block puts it, so its later requests follow it.

    Load guard: when that replica's outstanding tokens exceed the least-loaded candidate's by
    more than `margin_tokens`, the request goes to the least-loaded one instead (the prefix then
    spreads there too, through the index)."""

    name = "prefix_affinity"
    margin_tokens = 2048

    def __init__(self, rng: random.Random):
        pass

    def choose(self, request: RouteRequest, candidates: list[Candidate]) -> Candidate:
        key = _tie_key(request)
        longest = max(c.prefix_blocks for c in candidates)
        if longest > 0:
            holders = [c for c in candidates if c.prefix_blocks == longest]
            preferred = best(request, holders, lambda c: c.outstanding_tokens)
        elif request.block_hashes:
            preferred = max(candidates, key=lambda c: rendezvous_weight(key, c.replica.replica_id))
        else:
            return best(request, candidates, lambda c: c.outstanding_tokens)
        least = best(request, candidates, lambda c: c.outstanding_tokens)
        if preferred.outstanding_tokens - least.outstanding_tokens > self.margin_tokens:
            return least
        return preferred


class Balanced:
    """The default: one score in tokens of work, lowest wins.

        score = outstanding tokens                      (the platform's live load)
              + prompt tokens not in its prefix cache   (the prefill this request adds there)
              + KV_WEIGHT x tokens that do not fit in its free KV blocks
              + EVICT_WEIGHT x tokens that fit only by evicting cached prefixes

    A warm replica therefore wins until it holds about one prompt's worth more work than a cold
    one (the load guard is built in), and a replica that would have to evict or preempt to
    admit the request is avoided. A replica reports free blocks two ways: all of them, and those
    holding no cached prefix; blocks taken beyond the latter evict prefixes the prefix index
    (and so prefix placement) still counts on, so they cost as much as a prefill. Unknown
    metrics (none polled yet, or stale; a replica reporting only all free blocks) add nothing.
    """

    name = "balanced"
    kv_weight = 2.0
    evict_weight = 1.0
    # The router makes this choice in Redis, atomically with its lease, from the live loads
    # and prefix index (inference/routing_decision.py: the same score, in Lua); `choose` is
    # the same decision on a snapshot.
    decides_in_redis = True

    def __init__(self, rng: random.Random):
        pass

    @staticmethod
    def tie_order(request: RouteRequest, candidates: list[Candidate]) -> list[Candidate]:
        """The candidates in the order `best` prefers them at equal scores."""
        key = _tie_key(request)
        return sorted(candidates, key=lambda c: -rendezvous_weight(key, c.replica.replica_id))

    def score(self, request: RouteRequest, candidate: Candidate) -> float:
        miss = request.num_prompt_tokens - candidate.hit_tokens(request)
        shortfall = evicted = 0
        free, uncached = candidate.kv_free_blocks, candidate.kv_free_uncached_blocks
        if free is not None:
            needed = request.num_blocks_needed - candidate.prefix_blocks
            shortfall = max(0, needed - free) * BLOCK_SIZE
            if uncached is not None:
                evicted = max(0, min(needed, free) - uncached) * BLOCK_SIZE
        return (candidate.outstanding_tokens + miss + self.kv_weight * shortfall
                + self.evict_weight * evicted)

    def choose(self, request: RouteRequest, candidates: list[Candidate]) -> Candidate:
        return best(request, candidates, lambda c: self.score(request, c))


DEFAULT_POLICY = Balanced.name

POLICIES: dict[str, Callable[[random.Random], RoutingPolicy]] = {
    policy.name: policy for policy in (RoundRobin, LeastOutstandingTokens, PrefixAffinity, Balanced)
}
