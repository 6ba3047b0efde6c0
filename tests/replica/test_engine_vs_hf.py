"""Greedy output of our engine is token-identical to Hugging Face `generate` (float32, same weights)."""
from __future__ import annotations

import random

import pytest

from replica.engine.sampling_params import SamplingParams
from tests.replica.tiny_llama import TINY, hf_greedy, hf_model, our_engine

GREEDY = dict(temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def hf():
    return hf_model(TINY)


@pytest.fixture(scope="module")
def state_dict(hf):
    return {k: v.clone() for k, v in hf.state_dict().items()}


def _prompts(n: int, seed: int = 1, shared_prefix_len: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, TINY.vocab_size) for _ in range(shared_prefix_len)]
    return [prefix + [rng.randrange(3, TINY.vocab_size) for _ in range(rng.randrange(1, 60))] for _ in range(n)]


def _expected(hf, prompts, max_new):
    return [hf_greedy(hf, p, max_new) for p in prompts]


def test_batched_greedy_matches_hf(hf, state_dict):
    prompts = _prompts(6)
    engine = our_engine(TINY, state_dict)
    got = engine.generate(prompts, SamplingParams(max_tokens=12, **GREEDY))
    assert got == _expected(hf, prompts, 12)


def test_chunked_prefill_matches_hf(hf, state_dict):
    prompts = _prompts(3, seed=2, shared_prefix_len=70)  # longer than one 16-token chunk
    engine = our_engine(TINY, state_dict, max_num_batched_tokens=16)
    got = engine.generate(prompts, SamplingParams(max_tokens=10, **GREEDY))
    assert got == _expected(hf, prompts, 10)


def test_prefix_cache_hits_match_hf(hf, state_dict):
    prompts = _prompts(4, seed=3, shared_prefix_len=40)
    engine = our_engine(TINY, state_dict)
    params = SamplingParams(max_tokens=8, **GREEDY)
    first = engine.generate(prompts[:1], params)
    rest = engine.generate(prompts[1:], params)  # served partly from the cached shared prefix
    assert engine.stats().prefix_hit_tokens >= 3 * 32
    assert first + rest == _expected(hf, prompts, 8)


def test_preemption_in_tiny_pool_matches_hf(hf, state_dict):
    prompts = _prompts(5, seed=4)
    # 12 blocks of 16 tokens: five sequences growing to ~80 tokens cannot all stay resident
    engine = our_engine(TINY, state_dict, kv_cache_bytes=12 * 2 * 2 * 16 * 2 * 16 * 4)
    got = engine.generate(prompts, SamplingParams(max_tokens=40, **GREEDY))
    assert engine.stats().num_preemptions > 0
    assert got == _expected(hf, prompts, 40)
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks


def test_steps_cut_short_between_layers_still_match_hf(hf, state_dict):
    """Step interruption: every step the scheduler lets be cut short is, after its first layer;
    nothing of it counts, and the rerun gives the same tokens (and the same stats)."""
    prompts = _prompts(4, seed=5)
    engine = our_engine(TINY, state_dict)
    params = SamplingParams(max_tokens=10, **GREEDY)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    outputs: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished_requests():
        for output in engine.step(interrupt=lambda: True):
            outputs[output.request_id].extend(output.new_token_ids)
    stats = engine.stats()
    assert stats.num_interrupted_steps >= 5
    assert [outputs[f"r{i}"] for i in range(len(prompts))] == _expected(hf, prompts, 10)
    assert stats.prompt_tokens == sum(len(p) for p in prompts)  # interrupted prefills not counted
    assert stats.num_free_blocks == stats.num_total_blocks
