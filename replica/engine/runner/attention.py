"""Paged attention over the block pool, in plain PyTorch.

The KV pool of one layer is `[num_blocks, block_size, num_kv_heads, head_dim]` per K and V.
A step's tokens are flat (`T` tokens of all sequences back to back). Decode sequences (one new
token each) are attended in one batched call; each prefill chunk is attended on its own with a
causal mask offset by the tokens already in its context.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass
class PrefillSeq:
    query_start: int  # first of its tokens in the flat batch
    query_len: int
    context_len: int  # tokens in the cache after this step (cached prefix + this chunk)
    block_ids: torch.Tensor  # [ceil(context_len / block_size)] long


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] long: pool slot (block * block_size + offset) per token
    decode_token_idx: torch.Tensor | None  # [B] long: flat index of each decode token
    decode_block_tables: torch.Tensor | None  # [B, max_blocks] long, padded with block 0
    decode_mask: torch.Tensor | None  # [B, 1, 1, max_blocks * block_size] bool: True = attend
    decode_context_lens: torch.Tensor | None  # [B] long
    prefills: list[PrefillSeq]
    native: Any = None  # a native.NativeAttention on the CPU (float32, bfloat16, float16 KV), else None


def write_kv(k_pool: torch.Tensor, v_pool: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    # k_pool: [num_blocks, block_size, kvh, hd] viewed flat as [num_slots, kvh, hd]; k: [T, kvh, hd]
    k_pool.view(-1, *k_pool.shape[2:]).index_copy_(0, slots, k)
    v_pool.view(-1, *v_pool.shape[2:]).index_copy_(0, slots, v)


def _gather(pool: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    # pool: [num_blocks, bs, kvh, hd]; block_ids: [..., nb] -> [..., kvh, nb * bs, hd]
    blocks = pool[block_ids]  # [..., nb, bs, kvh, hd]
    *lead, nb, bs, kvh, hd = blocks.shape
    return blocks.view(*lead, nb * bs, kvh, hd).transpose(-3, -2)


def paged_attention(
    q: torch.Tensor,  # [T, nh, hd]
    k: torch.Tensor,  # [T, kvh, hd]: this step's keys and values (already written to the pools)
    v: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:  # [T, nh, hd]
    if meta.native is not None and not meta.prefills and meta.decode_token_idx is not None:
        # a pure decode step: token i of the batch is sequence i's query
        return meta.native.decode(q, k_pool, v_pool, meta.decode_block_tables, meta.decode_context_lens, scale)
    out = torch.empty_like(q)
    if meta.decode_token_idx is not None and meta.native is not None:
        od = meta.native.decode(q[meta.decode_token_idx], k_pool, v_pool, meta.decode_block_tables,
                                meta.decode_context_lens, scale)  # [B, nh, hd]
        out[meta.decode_token_idx] = od
    elif meta.decode_token_idx is not None:
        qd = q[meta.decode_token_idx].unsqueeze(2)  # [B, nh, 1, hd]
        kd = _gather(k_pool, meta.decode_block_tables)  # [B, kvh, L, hd]
        vd = _gather(v_pool, meta.decode_block_tables)
        od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True)
        out[meta.decode_token_idx] = od.squeeze(2)
    for seq in meta.prefills:
        rows = slice(seq.query_start, seq.query_start + seq.query_len)
        qp = q[rows].transpose(0, 1).unsqueeze(0)  # [1, nh, n, hd]
        if seq.context_len == seq.query_len:  # nothing cached before this chunk: no gather
            kp, vp = k[rows].transpose(0, 1).unsqueeze(0), v[rows].transpose(0, 1).unsqueeze(0)
            op = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, scale=scale, enable_gqa=True)
        else:
            kp = _gather(k_pool, seq.block_ids)[:, : seq.context_len].unsqueeze(0)  # [1, kvh, ctx, hd]
            vp = _gather(v_pool, seq.block_ids)[:, : seq.context_len].unsqueeze(0)
            # query i sits at position context_len - query_len + i and sees keys up to it
            offset = seq.context_len - seq.query_len
            rows = torch.arange(seq.query_len, device=q.device).unsqueeze(1) + offset
            cols = torch.arange(seq.context_len, device=q.device).unsqueeze(0)
            op = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=cols <= rows, scale=scale, enable_gqa=True)
        out[seq.query_start : seq.query_start + seq.query_len] = op.squeeze(0).transpose(0, 1)
    return out
