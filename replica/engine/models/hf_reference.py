"""Hugging Face transformers' LlamaForCausalLM built from our ModelConfig and state dict.

The reference our engine is compared against, in tests (token-identical greedy output) and in
`benchmarks.engine` (static-batch `generate`). transformers is imported lazily: the engine never
needs it.
"""
from __future__ import annotations

import torch

from replica.engine.config import ModelConfig


def hf_config(c: ModelConfig):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, rope_scaling=c.rope_scaling,
        max_position_embeddings=c.max_position_embeddings, tie_word_embeddings=c.tie_word_embeddings,
        bos_token_id=c.bos_token_id, eos_token_id=list(c.eos_token_ids), pad_token_id=0,
        attention_bias=False, mlp_bias=False,
    )


def hf_llama(c: ModelConfig, state_dict: dict[str, torch.Tensor] | None = None):
    """An eval-mode HF Llama; with `state_dict`, loaded from it (the tied head follows the
    embedding); without, HF's own random initialisation under the current torch seed."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM(hf_config(c)).eval()
    if state_dict is not None:
        model.load_state_dict(state_dict, strict=False)
        model.tie_weights()
    return model
