"""Greedy output of our engine is token-identical to Hugging Face `generate` (same weights, same
dtype), for every float dtype the engine runs, with the C decode-attention kernel and without it
(the PyTorch fallback), and on CUDA (both models there; skipped where no GPU is present:
scripts/gpu_check.sh runs them on a GPU machine)."""
from __future__ import annotations

import functools
import random

import pytest
import torch

from replica.engine.sampling_params import SamplingParams
from tests.replica.tiny_llama import TINY, TINY_HD64, hf_greedy, hf_model
from tests.replica.tiny_llama import our_engine as _our_engine

GREEDY = dict(temperature=0.0, ignore_eos=True)
# (dtype, C kernel on, device)
VARIANTS = [("float32", True, "cpu"), ("float32", False, "cpu"), ("bfloat16", True, "cpu"),
            ("bfloat16", False, "cpu"), ("float16", True, "cpu"),
            ("float32", False, "cuda"), ("bfloat16", False, "cuda"), ("float16", False, "cuda")]


@pytest.fixture(scope="module", params=VARIANTS,
                ids=[f"{d}-{'native' if n else 'torch'}" + ("-cuda" if dev == "cuda" else "") for d, n, dev in VARIANTS])
def variant(request):
    if request.param[2] == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device here: scripts/gpu_check.sh runs these on a GPU machine")
    return request.param


@pytest.fixture(autouse=True)
def _kernel_switch(variant, monkeypatch):
    if not variant[1]:
        monkeypatch.setenv("LLM_PLATFORM_NO_NATIVE", "1")


@pytest.fixture(scope="module")
def hf(variant):
    return hf_model(TINY).to(getattr(torch, variant[0])).to(variant[2])


@pytest.fixture(scope="module")
def state_dict(hf):
    return {k: v.detach().cpu().clone() for k, v in hf.state_dict().items()}


@pytest.fixture
def our_engine(variant):
    engine = functools.partial(_our_engine, dtype=variant[0], device=variant[2])

    def build(*args, **kwargs):
        e = engine(*args, **kwargs)
        assert (e.runner.native_attention is not None) == variant[1]
        return e
    return build


def _element_size(variant) -> int:
    return torch.empty((), dtype=getattr(torch, variant[0])).element_size()


def _prompts(n: int, seed: int = 1, shared_prefix_len: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefix = [rng.randrange(3, TINY.vocab_size) for _ in range(shared_prefix_len)]
    return [prefix + [rng.randrange(3, TINY.vocab_size) for _ in range(rng.randrange(1, 60))] for _ in range(n)]


def _expected(hf, prompts, max_new):
    return [hf_greedy(hf, p, max_new) for p in prompts]


def _assert_greedy(hf, prompts, got, max_new):
    """float32: token-identical to HF's greedy `generate`. bfloat16 / float16 (where HF's own
    incremental and full-sequence logits differ in the last bit): each of our tokens is HF's
    argmax, teacher-forced on our sequence, or within 4 units in the last place of the largest
    logit of it (a tie at that precision)."""
    dtype = next(hf.parameters()).dtype
    if dtype == torch.float32:
        assert got == _expected(hf, prompts, max_new)
        return
    for prompt, tokens in zip(prompts, got):
        assert len(tokens) == max_new
        with torch.no_grad():
            ids = torch.tensor([prompt + tokens[:-1]], device=next(hf.parameters()).device)
            logits = hf(ids).logits[0, len(prompt) - 1:].float().cpu()
        gap = logits.max(-1).values - logits[torch.arange(len(tokens)), torch.tensor(tokens)]
        ulp = torch.finfo(dtype).eps * 2.0 ** torch.floor(torch.log2(logits.abs().max()))
        assert float(gap.max()) <= 4 * ulp, (prompt, tokens, gap.tolist())


def test_batched_greedy_matches_hf(hf, state_dict, our_engine):
    prompts = _prompts(6)
    engine = our_engine(TINY, state_dict)
    got = engine.generate(prompts, SamplingParams(max_tokens=12, **GREEDY))
    _assert_greedy(hf, prompts, got, 12)


def test_batched_greedy_matches_hf_at_head_dim_64(variant, our_engine):
    """SmolLM2's attention shape (head dim 64, groups of 3): the kernel's main path (bfloat16:
    compile-time shape) over contexts that cross 16-token chunks and blocks."""
    hf64 = hf_model(TINY_HD64).to(getattr(torch, variant[0])).to(variant[2])
    prompts = _prompts(5, seed=3, shared_prefix_len=20)
    engine = our_engine(TINY_HD64, {k: v.detach().cpu().clone() for k, v in hf64.state_dict().items()})
    got = engine.generate(prompts, SamplingParams(max_tokens=12, **GREEDY))
    _assert_greedy(hf64, prompts, got, 12)


def test_chunked_prefill_matches_hf(hf, state_dict, our_engine):
    prompts = _prompts(3, seed=2, shared_prefix_len=70)  # longer than one 16-token chunk
    engine = our_engine(TINY, state_dict, max_num_batched_tokens=16)
    got = engine.generate(prompts, SamplingParams(max_tokens=10, **GREEDY))
    _assert_greedy(hf, prompts, got, 10)


def test_prefix_cache_hits_match_hf(hf, state_dict, our_engine):
    prompts = _prompts(4, seed=3, shared_prefix_len=40)
    engine = our_engine(TINY, state_dict)
    params = SamplingParams(max_tokens=8, **GREEDY)
    first = engine.generate(prompts[:1], params)
    rest = engine.generate(prompts[1:], params)  # served partly from the cached shared prefix
    assert engine.stats().prefix_hit_tokens >= 3 * 32
    _assert_greedy(hf, prompts, first + rest, 8)


def test_preemption_in_tiny_pool_matches_hf(hf, state_dict, our_engine, variant):
    prompts = _prompts(5, seed=4)
    # 12 blocks of 16 tokens: five sequences growing to ~80 tokens cannot all stay resident
    engine = our_engine(TINY, state_dict, kv_cache_bytes=12 * 2 * 2 * 16 * 2 * 16 * _element_size(variant))
    got = engine.generate(prompts, SamplingParams(max_tokens=40, **GREEDY))
    assert engine.stats().num_preemptions > 0
    _assert_greedy(hf, prompts, got, 40)
    assert engine.stats().num_free_blocks == engine.stats().num_total_blocks
