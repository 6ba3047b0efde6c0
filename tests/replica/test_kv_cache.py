"""Block pool, prefix cache and KV manager: exact block ids and eviction order."""
from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replica.engine.kv.block_hash import ROOT_HASH, hash_block, hash_full_blocks
from replica.engine.kv.block_pool import BlockPool, NoFreeBlocksError
from replica.engine.kv.manager import KVCacheManager
from replica.engine.request import Request
from replica.engine.sampling_params import SamplingParams


def _request(rid: str, tokens: list[int], salt: str = "") -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=4), arrival_time=0.0, cache_salt=salt)


def test_pool_allocates_from_head_and_frees_to_tail():
    pool = BlockPool(4)
    assert pool.allocate(2) == [0, 1]
    assert pool.free_block_ids() == [2, 3]
    pool.free([1, 0])
    assert pool.free_block_ids() == [2, 3, 1, 0]
    assert pool.allocate(3) == [2, 3, 1]
    with pytest.raises(NoFreeBlocksError):
        pool.allocate(2)


def test_pool_ref_counts_and_double_free():
    pool = BlockPool(2)
    [b] = pool.allocate(1)
    pool.touch([b])
    assert pool.ref_count(b) == 2
    pool.free([b])
    assert b not in pool.free_block_ids()
    pool.free([b])
    assert pool.free_block_ids() == [1, 0]
    with pytest.raises(RuntimeError):
        pool.free([b])


def test_hash_chain_depends_on_prefix_and_salt():
    a = hash_full_blocks(list(range(8)), 4)
    b = hash_full_blocks([99] + list(range(1, 8)), 4)
    assert len(a) == 2 and a[0] != b[0] and a[1] != b[1]  # block 1 differs only through the chain
    assert hash_full_blocks(list(range(8)), 4, "tenant-a") != a
    assert a[1] == hash_block(a[0], [4, 5, 6, 7])
    assert hash_full_blocks(list(range(9)), 4) == a  # the partial last block is not hashed


@pytest.mark.parametrize("salt", ["", "17", "tenant-\u00e9"])
def test_the_chain_is_hash_block_chained_block_by_block(salt):
    """`hash_full_blocks` (tokens packed once, one hash call a block) gives what chaining
    `hash_block` gives, from any number of known leading hashes; the router and the engine
    must agree on every hash."""
    rng = random.Random(7)
    for length in (0, 3, 4, 5, 8, 31, 32, 33, 150):
        tokens = [rng.randrange(-2, 1 << 40) for _ in range(length)]
        chained, parent = [], ROOT_HASH
        for start in range(0, length - 3, 4):
            parent = hash_block(parent, tokens[start:start + 4], salt)
            chained.append(parent)
        assert hash_full_blocks(tokens, 4, salt) == chained
        assert hash_full_blocks(tuple(tokens), 4, salt) == chained
        for known in range(len(chained) + 1):
            assert hash_full_blocks(tokens, 4, salt, chained[:known]) == chained


def test_prefix_hit_reuses_exact_blocks_and_lru_eviction_order():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    first = _request("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert kv.allocate(first, 10)
    assert kv.block_table("a") == [0, 1, 2]
    first.num_computed_tokens = 10
    kv.cache_full_blocks(first)
    kv.free(first)
    # freed last-first, so the tail block (never cached) is evicted before the prefix
    assert kv.pool.free_block_ids() == [3, 4, 5, 2, 1, 0]

    second = _request("b", list(range(8)) + [50, 51, 52])
    cached = kv.match(second)
    assert cached == [0, 1]
    assert kv.allocate(second, 3, cached)
    assert second.num_computed_tokens == 8
    assert kv.block_table("b") == [0, 1, 3]
    assert kv.pool.free_block_ids() == [4, 5, 2]

    # filling the pool evicts free cached blocks in LRU order; block 0/1 are in use, safe
    third = _request("c", [7] * 12)
    assert kv.allocate(third, 12)
    assert kv.block_table("c") == [4, 5, 2]
    assert not kv.allocate(_request("d", [1] * 5), 5)  # nothing free: refused, nothing changed
    assert kv.block_table("d") == []


def test_free_blocks_without_evicting_cached_prefixes():
    kv = KVCacheManager(num_blocks=6, block_size=4)
    first = _request("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert kv.allocate(first, 10)
    assert (kv.num_free_blocks, kv.num_free_uncached_blocks) == (3, 3)
    first.num_computed_tokens = 10
    kv.cache_full_blocks(first)
    assert (kv.num_free_blocks, kv.num_free_uncached_blocks) == (3, 3)  # cached, in use
    kv.free(first)
    assert (kv.num_free_blocks, kv.num_free_uncached_blocks) == (6, 4)  # blocks 0, 1 cached

    second = _request("b", list(range(8)) + [50, 51, 52])
    assert kv.allocate(second, 3, kv.match(second))  # touches 0, 1; takes 3
    assert (kv.num_free_blocks, kv.num_free_uncached_blocks) == (3, 3)
    kv.free(second)  # free list: 4, 5, 2, 3, 1, 0
    assert (kv.num_free_blocks, kv.num_free_uncached_blocks) == (6, 4)

    assert kv.allocate(_request("c", [7] * 12), 12)  # 4, 5, 2: nothing cached evicted
    assert (kv.num_free_blocks, kv.num_free_uncached_blocks) == (3, 1)
    assert kv.allocate(_request("d", [9] * 8), 8)  # 3, then 1: evicts the cached block 1
    assert (kv.num_free_blocks, kv.num_free_uncached_blocks) == (1, 0)


def test_match_leaves_one_token_to_compute_and_checks_tokens():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    r = _request("a", list(range(8)))
    kv.allocate(r, 8)
    r.num_computed_tokens = 8
    kv.cache_full_blocks(r)
    # an identical 8-token prompt may reuse only the first block: the last token must be computed
    assert kv.match(_request("b", list(range(8)))) == [0]
    # a forged hash collision is refused by the token check
    evil = _request("c", [9, 9, 9, 9, 1])
    evil.block_hashes = [r.block_hashes[0]]
    assert kv.match(evil) == []


def test_salt_isolates_tenants():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    r = _request("a", list(range(9)), salt="tenant-a")
    kv.allocate(r, 9)
    r.num_computed_tokens = 9
    kv.cache_full_blocks(r)
    assert kv.match(_request("b", list(range(9)), salt="tenant-b")) == []
    assert kv.match(_request("c", list(range(9)), salt="tenant-a")) == [0, 1]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 40), st.integers(0, 30), st.booleans()),
        min_size=1,
        max_size=25,
    )
)
def test_random_workloads_return_every_block(ops):
    """Random prompts sharing prefixes, growing, cancelled or finished in random order: in the
    end every block is free with ref count zero, and live tables never share a block they
    do not both hold a reference to."""
    kv = KVCacheManager(num_blocks=24, block_size=4)
    live: dict[str, Request] = {}
    for i, (prefix_id, length, grow, cancel_early) in enumerate(ops):
        tokens = [prefix_id] * 8 + list(range(100 + i, 100 + i + length))
        r = _request(f"r{i}", tokens, salt=str(prefix_id % 2))
        cached = kv.match(r)
        if not kv.allocate(r, len(tokens) - len(cached) * 4, cached):
            continue
        r.num_computed_tokens = len(tokens)
        kv.cache_full_blocks(r)
        live[r.request_id] = r
        if not cancel_early:
            for _ in range(grow):
                if not kv.allocate(r, 1):
                    break
                r.output_token_ids.append(7)
                r.num_computed_tokens += 1
                kv.cache_full_blocks(r)
        counts: dict[int, int] = {}
        for req in live.values():
            for b in kv.block_table(req.request_id):
                counts[b] = counts.get(b, 0) + 1
        assert all(kv.pool.ref_count(b) == n for b, n in counts.items())
        if cancel_early or i % 3 == 0:
            kv.free(live.pop(r.request_id))
    for r in list(live.values()):
        kv.free(r)
    assert kv.num_free_blocks == kv.num_blocks
    assert all(kv.pool.ref_count(b) == 0 for b in range(kv.num_blocks))
