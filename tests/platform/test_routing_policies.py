"""Routing policies on fixed snapshots: exact choices (pure functions, no Redis, no clock)."""
import random

import pytest

from inference.policies import (
    BLOCK_SIZE,
    DEFAULT_POLICY,
    POLICIES,
    Balanced,
    Candidate,
    LeastOutstandingTokens,
    PrefixAffinity,
    RoundRobin,
    RouteRequest,
    rendezvous_weight,
)
from models_registry.models import Model
from models_registry.selectors import ReplicaInfo


def replica(replica_id: int) -> ReplicaInfo:
    return ReplicaInfo(replica_id=replica_id, grpc_address=f"h:{replica_id}",
                       metrics_address="", zone="")


def cand(replica_id: int, outstanding: int = 0, prefix_blocks: int = 0,
         kv_free: int | None = None, kv_uncached: int | None = None) -> Candidate:
    return Candidate(replica(replica_id), outstanding, prefix_blocks=prefix_blocks,
                     kv_free_blocks=kv_free, kv_free_uncached_blocks=kv_uncached,
                     kv_total_blocks=None if kv_free is None else 1000)


# 40 full blocks of system prompt + a short user turn: 650 prompt tokens.
HASHES = tuple(range(1000, 1040))
LONG = RouteRequest(tenant_id=1, num_prompt_tokens=650, max_tokens=32, block_hashes=HASHES)
SHORT = RouteRequest(tenant_id=1, num_prompt_tokens=10, max_tokens=20)


def choose(policy_cls, request, candidates) -> int:
    return policy_cls(random.Random(0)).choose(request, candidates).replica.replica_id


def test_registry_names_match_the_model_field_choices():
    assert set(POLICIES) == set(Model.RoutingPolicy.values)
    assert DEFAULT_POLICY == "balanced" == Model._meta.get_field("routing_policy").default


def test_round_robin_cycles_in_id_order_whatever_the_load():
    candidates = [cand(3, 0), cand(1, 10_000), cand(2, 5)]
    picks = [choose(RoundRobin, RouteRequest(1, 10, 10, sequence=s), candidates)
             for s in range(1, 7)]
    assert picks == [2, 3, 1, 2, 3, 1]


def test_least_outstanding_tokens_picks_the_minimum():
    assert choose(LeastOutstandingTokens, LONG, [cand(1, 500), cand(2, 30), cand(3, 90)]) == 2


def test_prefix_affinity_prefers_the_longest_prefix():
    candidates = [cand(1, 0, prefix_blocks=0), cand(2, 700, prefix_blocks=40),
                  cand(3, 100, prefix_blocks=12)]
    assert choose(PrefixAffinity, LONG, candidates) == 2


def test_prefix_affinity_among_equal_holders_takes_the_less_loaded():
    candidates = [cand(1, 900, prefix_blocks=40), cand(2, 300, prefix_blocks=40), cand(3, 0)]
    assert choose(PrefixAffinity, LONG, candidates) == 2


def test_prefix_affinity_load_guard_spreads_to_the_least_loaded():
    margin = PrefixAffinity.margin_tokens
    at_margin = [cand(1, 100 + margin, prefix_blocks=40), cand(2, 100), cand(3, 5000)]
    assert choose(PrefixAffinity, LONG, at_margin) == 1  # exactly the margin: stays
    over = [cand(1, 101 + margin, prefix_blocks=40), cand(2, 100), cand(3, 5000)]
    assert choose(PrefixAffinity, LONG, over) == 2


def test_prefix_affinity_new_prefix_goes_to_its_rendezvous_replica():
    candidates = [cand(1), cand(2), cand(3)]
    expected = max((1, 2, 3), key=lambda rid: rendezvous_weight(HASHES[0], rid))
    assert choose(PrefixAffinity, LONG, candidates) == expected
    # The same first block from any process, any candidate order: the same replica.
    assert choose(PrefixAffinity, LONG, candidates[::-1]) == expected
    other = RouteRequest(2, 650, 32, block_hashes=(7,) + HASHES[1:])
    placements = {choose(PrefixAffinity, RouteRequest(2, 650, 32, block_hashes=(h,)), candidates)
                  for h in range(50)}
    assert placements == {1, 2, 3}  # different prefixes spread
    assert choose(PrefixAffinity, other, candidates) in {1, 2, 3}


def test_prefix_affinity_without_full_blocks_is_least_loaded():
    assert choose(PrefixAffinity, SHORT, [cand(1, 50), cand(2, 10), cand(3, 70)]) == 2


def test_balanced_score_is_load_plus_missed_prompt_plus_kv_shortfall():
    policy = Balanced(random.Random(0))
    # 650-token prompt, 40 blocks cached: 640 hit tokens, 10 to prefill.
    assert policy.score(LONG, cand(1, 100, prefix_blocks=40)) == 100 + 10
    assert policy.score(LONG, cand(1, 100)) == 100 + 650
    # Needs ceil(682 / 16) = 43 blocks; 40 cached, 3 new; 1 free -> 2 blocks short.
    assert policy.score(LONG, cand(1, 100, prefix_blocks=40, kv_free=1)) == \
        100 + 10 + Balanced.kv_weight * 2 * BLOCK_SIZE
    assert policy.score(LONG, cand(1, 100, prefix_blocks=40, kv_free=3)) == 110


def test_balanced_stays_warm_until_the_warm_replica_carries_a_prompt_more_work():
    # warm: 700 outstanding + 10 missed = 710; cold: 0 + 650 = 650 -> cold.
    assert choose(Balanced, LONG, [cand(1, 700, prefix_blocks=40), cand(2, 0)]) == 2
    # warm: 600 + 10 = 610 < 650 -> warm.
    assert choose(Balanced, LONG, [cand(1, 600, prefix_blocks=40), cand(2, 0)]) == 1


def test_balanced_avoids_a_replica_without_free_kv_blocks():
    candidates = [cand(1, 0, kv_free=0), cand(2, 400, kv_free=500), cand(3, 600, kv_free=500)]
    # 1: 0 + 650 + 2 * 43 * 16 = 2026; 2: 400 + 650 = 1050; 3: 1250.
    assert choose(Balanced, LONG, candidates) == 2


def test_balanced_counts_blocks_that_would_evict_cached_prefixes():
    policy = Balanced(random.Random(0))
    # LONG needs 43 blocks (682 tokens), none cached here: all free but 40 of the 100 free
    # blocks hold cached prefixes -> 60 uncached, enough.
    assert policy.score(LONG, cand(1, 0, kv_free=100, kv_uncached=60)) == 650
    # 30 uncached: 13 blocks would evict cached prefixes.
    assert policy.score(LONG, cand(1, 0, kv_free=100, kv_uncached=30)) == \
        650 + Balanced.evict_weight * 13 * BLOCK_SIZE
    # 20 free, 5 uncached: 23 blocks short (preemption) and 15 evicted.
    assert policy.score(LONG, cand(1, 0, kv_free=20, kv_uncached=5)) == \
        650 + Balanced.kv_weight * 23 * BLOCK_SIZE + Balanced.evict_weight * 15 * BLOCK_SIZE
    # Same load and free blocks: the replica that keeps its cached prefixes loses less.
    candidates = [cand(1, 0, kv_free=100, kv_uncached=0), cand(2, 100, kv_free=100,
                                                               kv_uncached=100)]
    assert choose(Balanced, LONG, candidates) == 2


def test_balanced_unknown_signals_add_nothing_and_ties_go_by_rendezvous():
    candidates = [cand(1), cand(2), cand(3)]
    expected = max((1, 2, 3), key=lambda rid: rendezvous_weight(HASHES[0], rid))
    assert choose(Balanced, LONG, candidates) == expected


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_returns_one_of_the_candidates_unchanged(name):
    candidates = [cand(1, 10, 3, 5), cand(2, 0, 0, None)]
    before = list(candidates)
    chosen = POLICIES[name](random.Random(0)).choose(LONG, candidates)
    assert chosen in before and candidates == before
