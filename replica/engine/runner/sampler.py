"""Token sampling: greedy, temperature, top-k, top-p, with per-request reproducible seeds.

A seeded request draws its i-th token from a generator seeded by (seed, i), so its output
depends only on its seed and its own logits: not on batch composition, step timing or
preemption and recompute.
"""
from __future__ import annotations

import torch

from replica.engine.sampling_params import SamplingParams

_MASK64 = (1 << 63) - 1


def _generator(seed: int, index: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + index * 7_919 + 1) & _MASK64)
    return g


def sample_one(logits: torch.Tensor, params: SamplingParams, seed: int, index: int) -> int:
    """logits: [vocab] float32 of one request."""
    if params.greedy:
        return int(torch.argmax(logits))
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, sorted_idx = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # keep the smallest set whose mass reaches top_p (the first token is always kept)
        drop = cumulative - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        choice = torch.multinomial(sorted_probs, 1, generator=_generator(seed, index))
        return int(sorted_idx[choice])
    return int(torch.multinomial(probs, 1, generator=_generator(seed, index)))


class Sampler:
    def sample(
        self,
        logits: torch.Tensor,  # [S, vocab] float32
        params: list[SamplingParams],
        seeds: list[int],
        indices: list[int],  # how many tokens each request has generated so far
    ) -> list[int]:
        greedy_rows = [i for i, p in enumerate(params) if p.greedy]
        tokens = [0] * len(params)
        if greedy_rows:
            if len(greedy_rows) == len(params):
                return torch.argmax(logits, dim=-1).tolist()
            picked = torch.argmax(logits[greedy_rows], dim=-1).tolist()
            for row, token in zip(greedy_rows, picked):
                tokens[row] = token
        for row, p in enumerate(params):
            if not p.greedy:
                tokens[row] = sample_one(logits[row], p, seeds[row], indices[row])
        return tokens
