"""int8 weights (models/quantization.py) on the tiny random Llama: the quantised layers and model
match float32 within tolerance, the engine generates with them, the names are checked."""
from __future__ import annotations

import pytest
import torch

from replica.backend.model_parameters import ModelParameters
from replica.engine.config import CHECKPOINT_FORMATS, EngineConfig, normalize_quantization
from replica.engine.llm_engine import LLMEngine, build_model
from replica.engine.models.gguf_linear import BlockEmbedding, GGUFLinear, dequantize_q8_0
from replica.engine.models.gguf_quants import GGML_TYPES, dequantize
from replica.engine.models.quantization import Int8Embedding, Int8Linear, quantize_int8, weight_bytes
from replica.engine.models.scoring import sequence_logits
from replica.engine.runner import native
from replica.engine.sampling_params import SamplingParams
from replica.launch import parse_args
from tests.replica.tiny_llama import TINY, ByteDecoder, hf_model

PORTS = ["--grpc-port", "1", "--http-port", "2", "--metrics-port", "3"]


@pytest.fixture(scope="module")
def state_dict():
    return hf_model(TINY).state_dict()


@pytest.mark.parametrize("name, expected", [("", "none"), ("none", "none"), ("int8", "int8"), (" INT8 ", "int8"),
                                            ("Q4_1", "none"), ("q8_0", "none"), ("F16", "none")])
def test_names(name, expected):
    assert normalize_quantization(name) == expected


def test_checkpoint_formats_are_the_gguf_types_the_loader_reads():
    """A version's "Q4_1" names its checkpoint's storage: the loader dequantises it, so it serves as none."""
    readable = {t.name for t in GGML_TYPES.values() if t.dequantize is not None}
    assert CHECKPOINT_FORMATS == readable


def test_int4_is_built_and_unknown_names_are_refused():
    assert normalize_quantization("INT4") == "int4"
    with pytest.raises(ValueError, match="unknown quantization 'fp8'"):
        normalize_quantization("fp8")


def test_unknown_quantization_fails_before_the_checkpoint_is_read():
    config = EngineConfig(model_path="/nonexistent.gguf", quantization="fp8")
    with pytest.raises(ValueError, match="unknown quantization"):
        LLMEngine.from_config(config)


def test_launch_takes_a_model_version_value():
    assert parse_args(["--model", "m", *PORTS]).quantization == "none"
    assert parse_args(["--model", "m", *PORTS, "--quantization", ""]).quantization == "none"
    assert parse_args(["--model", "m", *PORTS, "--quantization", "int8"]).quantization == "int8"
    assert parse_args(["--model", "m", *PORTS, "--quantization", "int4"]).quantization == "int4"
    with pytest.raises(SystemExit):
        parse_args(["--model", "m", *PORTS, "--quantization", "fp8"])


def test_model_parameters_carry_it_into_the_engine_config():
    raw = {"parameters": {"quantization": {"string_value": "int8"}}}
    assert ModelParameters.from_model_config(raw).engine_config(default_weights="/w").quantization == "int8"
    assert ModelParameters.from_model_config({"parameters": {}}).engine_config(default_weights="/w").quantization == "none"


def test_per_channel_int8_round_trip_is_within_half_a_step():
    w = torch.randn(48, 80) * torch.logspace(-3, 1, 48)[:, None]  # rows of very different scales
    w[5] = 0.0
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and q.abs().max() <= 127 and scale.shape == (48,)
    err = (q.float() * scale[:, None] - w).abs()
    assert (err <= scale[:, None] / 2 + 1e-7).all()
    assert (q[5] == 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 7, 200])  # 200: past the int8 kernel's row limit (dequantised GEMM)
def test_int8_linear_matches_float_within_tolerance(dtype, rows):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(96, 64, generator=gen) * 0.1
    x = torch.randn(rows, 64, generator=gen)
    layer = Int8Linear.from_float(w, dtype)
    y = layer(x.to(dtype))
    assert y.dtype == dtype and y.shape == (rows, 96)
    exact = x @ w.T
    rel = (y.float() - exact).norm() / exact.norm()
    assert rel < 0.02, rel
    # the same as multiplying by the dequantised weight: only rounding differs
    assert torch.allclose(y.float(), x.to(dtype).float() @ layer.dequantized_weight().T, rtol=0.02, atol=0.02)


def test_int8_on_the_cpu_is_q8_0_blocks_without_a_float_copy(state_dict):
    """Where the C block product exists: every projection and the head are Q8_0 blocks (one
    float16 scale per 32 values), no float weight kept, the tied embedding a lookup into the
    head's blocks; a block dequantises to within half a step of the float weight."""
    float_model = build_model(TINY, state_dict, "float32", "cpu")
    model = build_model(TINY, state_dict, "float32", "cpu", quantization="int8")
    assert model.quantization == "int8"
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    for layer, ref in zip(model.model.layers, float_model.model.layers):
        for proj, ref_proj in ((layer.self_attn.qkv_proj, ref.self_attn.qkv_proj), (layer.mlp.down_proj, ref.mlp.down_proj)):
            assert isinstance(proj, GGUFLinear) and proj.type_name == "Q8_0" and proj.weight is None
            w = ref_proj.weight.float()
            step = w.reshape(w.shape[0], -1, 32).abs().amax(-1, keepdim=True) / 127
            deq = dequantize_q8_0(proj.blocks, torch.float32)
            assert torch.equal(deq, torch.from_numpy(dequantize(proj.blocks.numpy().reshape(-1), 8)).reshape(deq.shape))
            err = (deq.reshape(w.shape[0], -1, 32) - w.reshape(w.shape[0], -1, 32)).abs()
            # half a step, plus the float16 scale's rounding (2^-11 relative) times at most 127 steps
            assert (err <= step * (0.5 + 127 * 2.0**-11) + 1e-9).all()
    assert isinstance(model.model.embed_tokens, BlockEmbedding) and model.model.embed_tokens.table[0] is model.quantized_head
    ids = torch.tensor([0, 5, TINY.vocab_size - 1])
    torch.testing.assert_close(model.model.embed_tokens(ids), float_model.model.embed_tokens(ids), atol=0.02, rtol=0.02)
    # weights at rest: 34 bytes per 32 matrix elements (the head once); norms stay float32
    c = TINY
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    rows_cols = [(q + 2 * kv, c.hidden_size), (c.hidden_size, q), (2 * c.intermediate_size, c.hidden_size),
                 (c.hidden_size, c.intermediate_size)] * c.num_layers + [(c.vocab_size, c.hidden_size)]
    norms = 4 * c.hidden_size * (2 * c.num_layers + 1)
    assert weight_bytes(model) == sum(r * k // 32 * 34 for r, k in rows_cols) + norms
    assert weight_bytes(model) < 0.3 * weight_bytes(float_model)


def test_quantize_model_replaces_every_projection_and_shares_the_tied_table(state_dict, monkeypatch):
    """Without the C block product (no compiler; other devices): PyTorch's int8 kernel, per channel."""
    monkeypatch.setattr(native, "load_gguf_matmul", lambda portable=False: None)
    model = build_model(TINY, state_dict, "float32", "cpu", quantization="int8")
    assert model.quantization == "int8"
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    for layer in model.model.layers:
        for proj in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
            assert isinstance(proj, Int8Linear) and proj.qweight.dtype == torch.int8
    assert isinstance(model.model.embed_tokens, Int8Embedding)
    assert model.model.embed_tokens.table[0] is model.quantized_head
    # weights at rest: 1 byte per matrix element + per row a scale (float32; bfloat16 for the kernel
    # and a float32 correction of its rounding); norms stay float32
    c = TINY
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    rows_cols = [(q + 2 * kv, c.hidden_size), (c.hidden_size, q), (2 * c.intermediate_size, c.hidden_size),
                 (c.hidden_size, c.intermediate_size)] * c.num_layers + [(c.vocab_size, c.hidden_size)]
    norms = 4 * c.hidden_size * (2 * c.num_layers + 1)
    assert weight_bytes(model) == sum(r * k + 10 * r for r, k in rows_cols) + norms
    float_model = build_model(TINY, state_dict, "float32", "cpu")
    assert weight_bytes(model) < 0.3 * weight_bytes(float_model)


@pytest.mark.parametrize("length", [24, 150])  # 150 tokens: the prefill runs the dequantised GEMM
def test_quantised_model_logits_match_float(state_dict, length):
    ids = [(i * 37 + 11) % TINY.vocab_size for i in range(length)]
    ref = sequence_logits(build_model(TINY, state_dict, "float32", "cpu"), ids)
    got = sequence_logits(build_model(TINY, state_dict, "float32", "cpu", quantization="int8"), ids)
    cos = torch.nn.functional.cosine_similarity(got, ref, dim=-1)
    assert cos.min() > 0.99, cos.min()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def _engine(state_dict, quantization: str, **kwargs) -> LLMEngine:
    config = EngineConfig(model_path="<memory>", dtype="float32", kv_cache_bytes=1 << 20, quantization=quantization,
                          **kwargs)
    model = build_model(TINY, state_dict, "float32", "cpu", quantization=quantization)
    return LLMEngine(config, TINY, model, ByteDecoder())


def test_engine_generates_with_int8_batched_as_alone(state_dict):
    prompts = [[1, 5, 9, 20, 33], [1, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 40], [1, 5, 9, 20, 34, 8]]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    engine = _engine(state_dict, "int8", max_num_batched_tokens=32)
    batched = engine.generate(prompts, params)  # chunked prefill, shared prefix blocks, one decode batch
    alone = [_engine(state_dict, "int8").generate([p], params)[0] for p in prompts]
    assert [len(b) for b in batched] == [12, 12, 12]
    assert batched == alone
    # the first greedy token agrees with the float engine's
    float_first = [out[0] for out in _engine(state_dict, "none").generate(prompts, params)]
    assert [out[0] for out in batched] == float_first


def test_engine_streams_text_and_stops_with_int8(state_dict):
    engine = _engine(state_dict, "int8")
    engine.add_request("r", [1, 60, 61, 62], SamplingParams(max_tokens=5, temperature=0.8, seed=3))
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    assert outputs[-1].finished and outputs[-1].finish_reason.value == "length"
    assert sum(len(o.new_token_ids) for o in outputs) == 5
