"""The C element-wise ops and the one-call decode step (csrc/decode_ops.c) against the PyTorch path.

- silu_mul (SiLU of the gate times up, from the fused gate_up output) and rope_ (RoPE in place on
  q and k of the fused qkv output), both builds, float32 and bfloat16, against the model's torch
  expressions: RoPE bit-equal; SiLU within one unit in the last place of the dtype (the vector
  exp is a polynomial, not torch's): float32 within 4 ulp, bfloat16 rarely differing.
- decode_layers: a decode step of a model with GGUF-block projections through the one C call
  gives the bits of the module path (logits and the K/V it writes), at 1 to 8 sequences; a step
  it does not cover (prefill, more rows, float weights) keeps the module path; an engine serves
  the same tokens either way.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from replica.engine.models.gguf_linear import BlockWeight, quantize_int4
from replica.engine.models.llama import rotate_half
from replica.engine.runner import native
from replica.engine.sampling_params import SamplingParams
from tests.replica.test_gguf_matmul import random_blocks
from tests.replica.tiny_llama import TINY_HD64, hf_model, our_engine


@pytest.fixture(scope="module", params=[False, True], ids=["best", "portable"])
def ops(request):
    k = native.load_decode_ops(portable=request.param)
    if k is None:
        pytest.skip("no C compiler here")
    return k


def ulp(want: torch.Tensor) -> torch.Tensor:
    return torch.finfo(want.dtype).eps * want.float().abs().clamp_min(torch.finfo(want.dtype).tiny)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,inter", [(1, 1536), (8, 1536), (64, 1536), (3, 40), (5, 7)])
def test_silu_mul_matches_torch(ops, dtype, rows, inter):
    g = torch.Generator().manual_seed(rows * inter)
    gate_up = (torch.randn(rows, 2 * inter, generator=g) * 4).to(dtype)
    gate_up[0, :3] = torch.tensor([100.0, -100.0, 0.0]).to(dtype)  # saturating ends and zero
    want = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    got = ops.silu_mul(gate_up)
    assert got.dtype == dtype and got.shape == (rows, inter)
    # float32: within 4 ulp (the polynomial exp's 2 ulp, then the division and the product);
    # bfloat16: silu rounds to the same value but where the float32 values straddle a rounding
    # boundary, then one ulp of the product
    assert bool(((got.float() - want.float()).abs() <= 4 * ulp(want) + 1e-30).all())
    if dtype == torch.bfloat16:
        assert (got != want).float().mean() < 0.02


def test_silu_mul_keeps_nan_and_infinities(ops):
    gate_up = torch.tensor([[float("nan"), float("inf"), float("-inf"), 1.0, 2.0, 3.0, 4.0, 5.0]])
    got = ops.silu_mul(gate_up)
    want = torch.nn.functional.silu(gate_up[:, :4]) * gate_up[:, 4:]
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[~got.isnan()], want[~want.isnan()])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,nh,kvh,hd", [(1, 9, 3, 64), (7, 6, 2, 64), (64, 9, 3, 64), (3, 4, 2, 16), (2, 2, 1, 6)])
def test_rope_in_place_equals_the_torch_expression(ops, dtype, rows, nh, kvh, hd):
    g = torch.Generator().manual_seed(rows * nh * hd)
    qkv = torch.randn(rows, nh + 2 * kvh, hd, generator=g).to(dtype)
    pos = torch.randint(0, 4000, (rows,), generator=g).float()
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    emb = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)
    cos, sin = emb.cos().to(dtype).unsqueeze(1), emb.sin().to(dtype).unsqueeze(1)
    qk = qkv[:, : nh + kvh]
    want = qk * cos + rotate_half(qk) * sin
    v_before = qkv[:, nh + kvh :].clone()
    got = ops.rope_(qkv, nh + kvh, cos, sin)
    assert got is qkv
    assert torch.equal(qkv[:, : nh + kvh], want)  # bit for bit
    assert torch.equal(qkv[:, nh + kvh :], v_before)  # v untouched


def test_refusals(ops):
    with pytest.raises(ValueError):
        ops.rope_(torch.zeros(2, 3, 8).transpose(0, 1), 1, torch.zeros(3, 8), torch.zeros(3, 8))


# ---- the one-call decode step ----

def int4_tiny(dtype: str = "bfloat16", seed: int = 0):
    """TINY_HD64 (hidden 96, head dim 64, groups of 3) with random Q4_1 / Q4_0 / Q8_0 blocks for its
    projections and head (prefill keeps the float weights; decode reads the blocks)."""
    c = TINY_HD64
    state = hf_model(c, seed=seed).state_dict()
    engine = our_engine(c, state, dtype=dtype, kv_cache_bytes=4 << 20, max_num_seqs=16)
    rng = np.random.default_rng(seed)
    blocks = {}
    kinds = ["Q4_1", "Q4_0", "Q8_0"]
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        shapes = {"self_attn.q_proj": (c.num_heads * c.head_dim, c.hidden_size),
                  "self_attn.k_proj": (c.num_kv_heads * c.head_dim, c.hidden_size),
                  "self_attn.v_proj": (c.num_kv_heads * c.head_dim, c.hidden_size),
                  "self_attn.o_proj": (c.hidden_size, c.num_heads * c.head_dim),
                  "mlp.gate_proj": (c.intermediate_size, c.hidden_size),
                  "mlp.up_proj": (c.intermediate_size, c.hidden_size),
                  "mlp.down_proj": (c.hidden_size, c.intermediate_size)}
        for j, (name, (n, k)) in enumerate(shapes.items()):
            kind = kinds[(i + (j if j in (3, 6) else 0)) % 3]  # qkv and gate_up one type each, others vary
            blocks[p + name + ".weight"] = BlockWeight(kind, torch.from_numpy(random_blocks(kind, n, k, rng)))
    blocks["model.embed_tokens.weight"] = BlockWeight(
        "Q8_0", torch.from_numpy(random_blocks("Q8_0", c.vocab_size, c.hidden_size, rng)))
    quantize_int4(engine.runner.model, blocks)
    return engine


def both_paths(engine):
    """Patch the model: each step runs the module path, then the fused one on the same input,
    and records (rows, fused?, logits equal?, K/V equal?)."""
    model = engine.runner.model
    forward, seen = model.forward, []

    def run(input_ids, positions, kv_pools, meta, logits_idx):
        model.fused_decode = False
        want = forward(input_ids, positions, kv_pools, meta, logits_idx)
        written = [(k.clone(), v.clone()) for k, v in kv_pools]
        for k, v in kv_pools:  # the fused step must write this step's K/V itself
            k.view(-1, *k.shape[2:])[meta.slot_mapping] = 0
            v.view(-1, *v.shape[2:])[meta.slot_mapping] = 0
        model.fused_decode = True
        fused = model._fused_step(model.model.embed_tokens(input_ids), kv_pools, meta) is not None
        got = forward(input_ids, positions, kv_pools, meta, logits_idx)
        kv_same = all(torch.equal(k, wk) and torch.equal(v, wv) for (k, v), (wk, wv) in zip(kv_pools, written))
        seen.append((input_ids.shape[0], fused, torch.equal(got, want), kv_same))
        return got

    model.forward = run
    return seen


@pytest.mark.parametrize("batch", [1, 3, 8, 11])
def test_fused_decode_step_is_the_module_path_bit_for_bit(batch):
    if native.load_decode_ops() is None or native.load_gguf_matmul() is None or native.load() is None:
        pytest.skip("no C compiler here")
    engine = int4_tiny()
    seen = both_paths(engine)
    prompts = [[5 + i, 17, 33 + 2 * i, 9, 70 + i][: 2 + i % 4] * (1 + i % 3) for i in range(batch)]
    engine.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))
    fused_steps = [s for s in seen if s[1]]
    if batch > 8:  # a step of more sequences than the block product covers keeps the module path
        assert not fused_steps, seen
    else:
        assert len(fused_steps) == 5 and all(rows == batch for rows, *_ in fused_steps), seen
    assert all(logits_same and kv_same for _, _, logits_same, kv_same in seen), seen


def test_fused_step_needs_block_weights():
    if native.load_decode_ops() is None:
        pytest.skip("no C compiler here")
    engine = our_engine(TINY_HD64, hf_model(TINY_HD64).state_dict(), dtype="bfloat16", kv_cache_bytes=4 << 20)
    seen = both_paths(engine)
    engine.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0))
    assert not any(fused for _, fused, *_ in seen)  # float weights: the module path


def test_engine_serves_the_same_tokens_fused_or_not():
    if native.load_decode_ops() is None or native.load_gguf_matmul() is None:
        pytest.skip("no C compiler here")
    prompts = [[5, 17, 33, 9], [70, 71], [3, 4, 5, 6, 7, 8, 9]]
    answers = []
    for fused in (True, False):
        engine = int4_tiny()
        engine.runner.model.fused_decode = fused
        answers.append(engine.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0)))
    assert answers[0] == answers[1]


def test_fused_step_follows_the_block_products_row_limit():
    if native.load_decode_ops() is None or native.load_gguf_matmul() is None or native.load() is None:
        pytest.skip("no C compiler here")
    from replica.engine.models.gguf_linear import set_kernel_max_rows

    engine = int4_tiny()
    seen = both_paths(engine)
    engine.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=3, temperature=0.0))
    assert any(fused for _, fused, *_ in seen)
    set_kernel_max_rows(engine.runner.model, 1)  # the products take the float GEMM above one row
    seen.clear()
    engine.generate([[5, 6, 7], [8, 9]], SamplingParams(max_tokens=3, temperature=0.0))
    assert seen and not any(fused for rows, fused, *_ in seen if rows > 1)
    assert all(logits_same and kv_same for _, _, logits_same, kv_same in seen), seen


@pytest.mark.parametrize("batch,threads", [(1, 2), (5, 2), (8, 3)])
def test_fused_step_with_one_thread_team_is_the_module_path_bit_for_bit(batch, threads):
    """More than one thread: decode_layers runs one OpenMP team for the whole call (threads split
    each product's rows and the sequences' attention, meeting at barriers); same bits as the
    module path, and as the per-kernel parallel regions."""
    ops = native.load_decode_ops()
    if ops is None or native.load_gguf_matmul() is None or native.load() is None:
        pytest.skip("no C compiler here")
    prompts = [[5 + i, 17, 33 + 2 * i, 9, 70 + i][: 2 + i % 4] * (1 + i % 3) for i in range(batch)]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        answers = []
        for team in (True, False):
            ops.set_team(team)
            engine = int4_tiny()
            engine.runner.model._fused_layers = None
            seen = both_paths(engine)
            answers.append(engine.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0)))
            fused_steps = [s for s in seen if s[1]]
            assert len(fused_steps) == 5 and all(rows == batch for rows, *_ in fused_steps), seen
            assert all(logits_same and kv_same for _, _, logits_same, kv_same in seen), seen
    finally:
        ops.set_team(ops.TEAM_DEFAULT)
        torch.set_num_threads(before)
    assert answers[0] == answers[1]


@pytest.mark.parametrize("batch", [1, 3])
def test_int8_decode_runs_the_fused_step_bit_for_bit(batch):
    """int8 (Q8_0 blocks against float activations, no float copy) takes the one-call decode step
    in bfloat16 too, with the same bits as its module path."""
    if native.load_decode_ops() is None or native.load_gguf_matmul() is None or native.load() is None:
        pytest.skip("no C compiler here")
    engine = our_engine(TINY_HD64, hf_model(TINY_HD64).state_dict(), dtype="bfloat16", kv_cache_bytes=4 << 20,
                        quantization="int8")
    assert engine.runner.model.quantization == "int8"
    seen = both_paths(engine)
    prompts = [[5 + i, 17, 33 + 2 * i, 9, 70 + i][: 2 + i % 4] * (1 + i % 3) for i in range(batch)]
    engine.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0))
    fused_steps = [s for s in seen if s[1]]
    assert len(fused_steps) == 5 and all(rows == batch for rows, *_ in fused_steps), seen
    assert all(logits_same and kv_same for _, _, logits_same, kv_same in seen), seen
