"""The C decode-attention kernel equals the PyTorch path on the same paged pool."""
from __future__ import annotations

import pytest
import torch

from replica.engine.runner import native
from replica.engine.runner.attention import AttentionMetadata, paged_attention


@pytest.fixture(scope="module", params=[False, True], ids=["best", "portable"])
def kernel(request):
    """The kernel as the engine loads it (AVX-512 where the CPU has it) and its portable build."""
    k = native.load(portable=request.param)
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


def _random_paged(seed, dtype, nh, kvh, hd, bs, lens):
    """Pools of `dtype`, random block tables (distinct blocks per sequence, padded with
    garbage block ids past each sequence's last block), queries in `dtype`."""
    g = torch.Generator().manual_seed(seed)
    num_blocks = 2 * (max(lens) + bs - 1) // bs + 8
    k_pool = torch.randn(num_blocks, bs, kvh, hd, generator=g).to(dtype)
    v_pool = torch.randn(num_blocks, bs, kvh, hd, generator=g).to(dtype)
    lens = torch.tensor(lens)
    max_blocks = int((lens.max() + bs - 1) // bs)
    tables = torch.stack([torch.randperm(num_blocks, generator=g)[:max_blocks] for _ in lens])
    q = (torch.randn(len(lens), nh, hd, generator=g) * 2).to(dtype)
    return q, k_pool, v_pool, tables, lens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("nh,kvh,hd,bs", [(9, 3, 64, 16), (4, 4, 32, 8), (8, 1, 128, 32), (6, 2, 64, 1)])
def test_native_decode_equals_float32_reference_per_dtype(kernel, dtype, nh, kvh, hd, bs):
    """The kernel widens K/V exactly and computes in float32: it equals a float32 PyTorch
    reference on the widened pool up to float32 rounding, then one rounding to `dtype`."""
    q, k_pool, v_pool, tables, lens = _random_paged(nh + hd + bs, dtype, nh, kvh, hd, bs, [1, 7, 16, 17, 100, 333])
    meta = dict(slot_mapping=torch.zeros(0, dtype=torch.long), decode_token_idx=torch.arange(len(lens)),
                decode_block_tables=tables, decode_context_lens=lens, prefills=[])
    ours = paged_attention(q, None, None, k_pool, v_pool, AttentionMetadata(**meta, decode_mask=None, native=kernel), 0.125)
    assert ours.dtype == dtype
    mask = (torch.arange(tables.shape[1] * bs)[None] < lens[:, None]).view(len(lens), 1, 1, -1)
    ref = paged_attention(q.float(), None, None, k_pool.float(), v_pool.float(),
                          AttentionMetadata(**meta, decode_mask=mask, native=None), 0.125)
    tol = {torch.float32: dict(atol=1e-5, rtol=1e-4), torch.bfloat16: dict(atol=1e-2, rtol=8e-3),
           torch.float16: dict(atol=1e-3, rtol=1e-3)}[dtype]
    torch.testing.assert_close(ours.float(), ref, **tol)
    # and the PyTorch path in the engine's own dtype (what runs without the kernel) is close too
    torch_path = paged_attention(q, None, None, k_pool, v_pool, AttentionMetadata(**meta, decode_mask=mask, native=None), 0.125)
    torch.testing.assert_close(ours.float(), torch_path.float(), atol=3e-2, rtol=3e-2)


def test_native_decode_refuses_shapes_beyond_its_buffers(kernel):
    q, k_pool, v_pool, tables, lens = _random_paged(1, torch.float32, 2, 1, 512, 4, [5])
    with pytest.raises(ValueError, match="limits"):
        kernel.decode(q, k_pool, v_pool, tables, lens, 0.1)


@pytest.mark.parametrize("nh,kvh,hd,bs", [(9, 3, 64, 16), (8, 1, 128, 32), (6, 2, 64, 1), (4, 4, 32, 8)])
def test_bf16_dot_path_and_widening_path_both_match_the_float32_reference(nh, kvh, hd, bs):
    """bfloat16 pools and queries on a CPU with AVX512-BF16: the vdpbf16ps path (probabilities
    rounded to bfloat16 before the product with V) and the widening float32 path both equal the
    float32 reference within bfloat16's tolerance, and they are not the same code (their bits
    differ); float32 queries that are not bfloat16 values always take the widening path."""
    kernel = native.load()
    if kernel is None or not kernel.has_bf16_dot:
        pytest.skip("no AVX512-BF16 here: the widening path is the only one (tested above)")
    q, k_pool, v_pool, tables, lens = _random_paged(hd + nh, torch.bfloat16, nh, kvh, hd, bs, [1, 2, 15, 33, 100, 333])
    mask = (torch.arange(tables.shape[1] * bs)[None] < lens[:, None]).view(len(lens), 1, 1, -1)
    ref = paged_attention(q.float(), None, None, k_pool.float(), v_pool.float(),
                          AttentionMetadata(slot_mapping=torch.zeros(0, dtype=torch.long),
                                            decode_token_idx=torch.arange(len(lens)), decode_block_tables=tables,
                                            decode_context_lens=lens, prefills=[], decode_mask=mask, native=None),
                          hd**-0.5)
    outs = {}
    try:
        for on in (True, False):
            kernel.set_bf16_dot(on)
            outs[on] = kernel.decode(q, k_pool, v_pool, tables, lens, hd**-0.5)
            torch.testing.assert_close(outs[on].float(), ref, atol=1e-2, rtol=8e-3)
        assert not torch.equal(outs[True], outs[False])
        q32 = q.float() + 1e-3 * torch.randn(q.shape)  # float32 values, not bfloat16 ones
        kernel.set_bf16_dot(True)
        dot_on = kernel.decode(q32, k_pool, v_pool, tables, lens, hd**-0.5)
        kernel.set_bf16_dot(False)
        assert torch.equal(dot_on, kernel.decode(q32, k_pool, v_pool, tables, lens, hd**-0.5))
    finally:
        kernel.set_bf16_dot(True)
