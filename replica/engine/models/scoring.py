"""Logits at every position of a token sequence: one prefill through the model, outside the
engine (its own small KV pool), for quality probes that compare two versions of a model."""
from __future__ import annotations

import torch

from replica.engine.models.llama import LlamaForCausalLM
from replica.engine.runner.attention import AttentionMetadata, PrefillSeq


@torch.inference_mode()
def sequence_logits(model: LlamaForCausalLM, ids: list[int], block_size: int = 16) -> torch.Tensor:
    """[len(ids), vocab] float32: row i predicts token i + 1."""
    c, n = model.config, len(ids)
    device = model.inv_freq.device
    dtype = next(model.parameters()).dtype
    blocks = torch.arange((n + block_size - 1) // block_size, device=device)
    shape = (len(blocks), block_size, c.num_kv_heads, c.head_dim)
    pools = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
             for _ in range(c.num_layers)]
    meta = AttentionMetadata(slot_mapping=torch.arange(n, device=device), decode_token_idx=None,
                             decode_block_tables=None, decode_mask=None, decode_context_lens=None,
                             prefills=[PrefillSeq(query_start=0, query_len=n, context_len=n, block_ids=blocks)])
    positions = torch.arange(n, device=device)
    return model(torch.tensor(ids, device=device), positions, pools, meta, positions).float()


def answer_logits(model: LlamaForCausalLM, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """[len(answer), vocab]: the logits that predicted each answer token (teacher-forced)."""
    return sequence_logits(model, prompt + answer)[len(prompt) - 1 : len(prompt) - 1 + len(answer)]
