"""A random-weight tiny Llama shared by the engine tests: our model and HF's from one state dict."""
from __future__ import annotations

import torch

from replica.engine.config import EngineConfig, ModelConfig
from replica.engine.llm_engine import LLMEngine, build_model
from replica.engine.models.hf_reference import hf_llama

TINY = ModelConfig(
    vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
    head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512,
    tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,),
)

# the decode-attention kernel's main path: head dim 64, 3 query heads per KV head (SmolLM2's shape)
TINY_HD64 = ModelConfig(
    vocab_size=256, hidden_size=96, intermediate_size=128, num_layers=2, num_heads=6, num_kv_heads=2,
    head_dim=64, rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512,
    tie_word_embeddings=True, bos_token_id=1, eos_token_ids=(2,),
)


class ByteDecoder:
    """Token id -> one byte: enough to exercise incremental detokenisation with UTF-8."""

    eos_token_ids = (2,)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(i % 256 for i in ids if i >= 3).decode("utf-8", errors="replace")


def hf_model(c: ModelConfig, state_dict=None, seed: int = 0):
    torch.manual_seed(seed)
    model = hf_llama(c, state_dict)
    if state_dict is None:
        with torch.no_grad():  # larger weights than HF's init make greedy outputs varied
            for p in model.parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.25)
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt], device=device), attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device),
            max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
        )
    return out[0, len(prompt):].tolist()


def our_engine(c: ModelConfig, state_dict, *, kv_cache_bytes=1 << 20, dtype: str = "float32",
               device: str = "cpu", **engine_kwargs) -> LLMEngine:
    config = EngineConfig(model_path="<memory>", dtype=dtype, kv_cache_bytes=kv_cache_bytes, device=device,
                          **engine_kwargs)
    model = build_model(c, state_dict, dtype, device, quantization=config.quantization)
    return LLMEngine(config, c, model, ByteDecoder())
