"""SmolLM2-135M (the bundled GGUF): our engine's greedy tokens equal transformers' `generate`
with the same weights in float32, batched, through prefix-cache hits, chunked prefill and
preemption in a tiny pool."""
from __future__ import annotations

import pytest
import torch

from replica.engine.config import EngineConfig
from replica.engine.llm_engine import LLMEngine, build_model
from replica.engine.models.loader import default_model_path, load_checkpoint
from replica.engine.runner.model_runner import kv_bytes_per_block
from replica.engine.sampling_params import SamplingParams
from replica.engine.models.hf_reference import hf_llama
from tests.replica.tiny_llama import hf_greedy

pytestmark = pytest.mark.slow

SYSTEM = "You are a careful assistant. Answer briefly and precisely. " * 6
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name three colours."}],
    [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Wie heißt die Hauptstadt von Österreich? 日本語も少し。"}],
    [{"role": "user", "content": "Write a haiku about the sea. " + "Waves and salt and wind. " * 20}],
]
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def checkpoint():
    return load_checkpoint(default_model_path())


@pytest.fixture(scope="module")
def prompts(checkpoint):
    return [checkpoint.tokenizer.encode_chat(c) for c in CHATS]


@pytest.fixture(scope="module")
def expected(checkpoint, prompts):
    hf = hf_llama(checkpoint.config, checkpoint.state_dict)
    return [hf_greedy(hf, p, NEW_TOKENS) for p in prompts]


def _engine(checkpoint, **kwargs) -> LLMEngine:
    config = EngineConfig(model_path=default_model_path(), dtype="float32", **kwargs)
    model = build_model(checkpoint.config, checkpoint.state_dict, "float32", "cpu")
    return LLMEngine(config, checkpoint.config, model, checkpoint.tokenizer)


def test_prompts_cover_the_hard_cases(prompts):
    assert max(len(p) for p in prompts) > 128  # longer than one prefill chunk below
    assert prompts[1][:60] == prompts[2][:60]  # a shared system prompt for the prefix cache


def test_batched_chunked_and_prefix_cached_greedy_equals_hf(checkpoint, prompts, expected):
    engine = _engine(checkpoint, kv_cache_bytes=64 << 20, max_num_batched_tokens=128)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    first = engine.generate(prompts[:2], params)
    rest = engine.generate(prompts[2:], params)  # the system prompt comes from the prefix cache
    assert engine.stats().prefix_hit_tokens >= 64
    assert first + rest == expected


def test_preemption_in_tiny_pool_equals_hf(checkpoint, prompts, expected):
    per_block = kv_bytes_per_block(checkpoint.config, 16, torch.float32)
    longest = max(len(p) for p in prompts) + NEW_TOKENS
    # room for the longest sequence plus a little: the others must be preempted and recomputed
    num_blocks = longest // 16 + 4
    engine = _engine(checkpoint, kv_cache_bytes=num_blocks * per_block, max_num_batched_tokens=256)
    got = engine.generate(prompts, SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True))
    assert engine.stats().num_preemptions > 0
    assert got == expected


def test_text_streams_as_valid_utf8(checkpoint, prompts):
    engine = _engine(checkpoint, kv_cache_bytes=64 << 20)
    engine.add_request("u", prompts[2], SamplingParams(max_tokens=24, temperature=0.0))
    deltas, tokens = [], []
    while engine.has_unfinished_requests():
        for out in engine.step():
            deltas.append(out.text_delta)
            tokens.extend(out.new_token_ids)
    assert all("\ufffd" not in d for d in deltas)
    # a character cut off by max_tokens is never emitted half
    assert "".join(deltas) == checkpoint.tokenizer.decode(tokens).rstrip("\ufffd")
    assert any(ord(ch) > 0x3000 for ch in "".join(deltas))  # multi-byte text did stream
