"""The C decode-attention kernel equals the PyTorch path on the same paged pool."""
from __future__ import annotations

import pytest
import torch

from replica.engine.runner import native
from replica.engine.runner.attention import AttentionMetadata, paged_attention


@pytest.fixture(scope="module")
def kernel():
    k = native.load()
    if k is None:
        pytest.skip("no C compiler here: the engine runs the PyTorch path (tested elsewhere)")
    return k


@pytest.mark.parametrize("nh,kvh", [(9, 3), (4, 4), (8, 1)])
def test_native_decode_equals_torch(kernel, nh, kvh):
    torch.manual_seed(nh * 10 + kvh)
    hd, bs, num_blocks = 32, 16, 64
    k_pool, v_pool = torch.randn(num_blocks, bs, kvh, hd), torch.randn(num_blocks, bs, kvh, hd)
    lens = torch.tensor([1, 15, 16, 17, 100, 200])
    max_blocks = int((lens.max() + bs - 1) // bs)
    tables = torch.stack([torch.randperm(num_blocks)[:max_blocks] for _ in lens])
    q = torch.randn(len(lens), nh, hd)
    mask = (torch.arange(max_blocks * bs)[None] < lens[:, None]).view(len(lens), 1, 1, -1)
    common = dict(slot_mapping=torch.zeros(0, dtype=torch.long), decode_token_idx=torch.arange(len(lens)),
                  decode_block_tables=tables, decode_mask=mask, decode_context_lens=lens, prefills=[])
    ours = paged_attention(q, None, None, k_pool, v_pool, AttentionMetadata(**common, native=kernel), 0.2)
    ref = paged_attention(q, None, None, k_pool, v_pool, AttentionMetadata(**common, native=None), 0.2)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-4)


def test_engine_without_native_kernel_still_matches_hf(monkeypatch):
    from tests.replica.test_engine_vs_hf import _prompts
    from tests.replica.tiny_llama import TINY, hf_greedy, hf_model, our_engine
    from replica.engine.sampling_params import SamplingParams

    monkeypatch.setenv("LLM_PLATFORM_NO_NATIVE", "1")
    hf = hf_model(TINY)
    engine = our_engine(TINY, {k: v.clone() for k, v in hf.state_dict().items()})
    assert engine.core.runner.native_attention is None
    prompts = _prompts(3, seed=9)
    got = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    assert got == [hf_greedy(hf, p, 8) for p in prompts]
