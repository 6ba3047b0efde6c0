"""Token sampling: greedy, temperature, top-k, top-p, with per-request reproducible seeds.

A seeded request draws its i-th token from a generator seeded by (seed, i), so its output
depends only on its seed and its own logits: not on batch composition, step timing or
preemption and recompute.

Invariants (no request's values can fail another's, or the step):
- sampling computes in float32 whatever the model's dtype;
- a temperature below `sampling_params.GREEDY_TEMPERATURE` is greedy (SamplingParams.greedy):
  dividing by it would overflow the logits to inf and the softmax to NaN;
- a row whose logits hold NaN or +inf, or only -inf (the model's fault, never the request's),
  fails that row alone: `sample` returns a `SampleError` in its place;
- a row whose distribution turns out degenerate after temperature, top-k and top-p (no finite
  positive mass) falls back to its greedy token: the limit it was heading to;
- an unexpected exception while sampling one row fails that row alone.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from replica.engine.sampling_params import SamplingParams

_MASK64 = (1 << 63) - 1
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleError:
    """One row could not be sampled; its request fails with an internal error."""

    message: str


def _generator(seed: int, index: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + index * 7_919 + 1) & _MASK64)
    return g


def sample_one(logits: torch.Tensor, params: SamplingParams, seed: int, index: int) -> int:
    """logits: [vocab] of one request, finite or -inf (checked by the caller)."""
    logits = logits.float()
    if params.greedy:
        return int(torch.argmax(logits))
    scaled = logits / params.temperature
    vocab = scaled.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    generator = _generator(seed, index)
    if params.top_p < 1.0:
        sorted_probs, sorted_idx = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # keep the smallest set whose mass reaches top_p (the first token is always kept)
        drop = cumulative - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        if not _is_distribution(sorted_probs):
            return int(torch.argmax(logits))
        choice = torch.multinomial(sorted_probs, 1, generator=generator)
        return int(sorted_idx[choice])
    if not _is_distribution(probs):
        return int(torch.argmax(logits))
    return int(torch.multinomial(probs, 1, generator=generator))


def _is_distribution(probs: torch.Tensor) -> bool:
    """What torch.multinomial accepts: finite, non-negative, some positive mass."""
    total = float(probs.sum())
    return math.isfinite(total) and total > 0.0 and bool(torch.isfinite(probs).all()) \
        and not bool((probs < 0).any())


class Sampler:
    def __init__(self, row_argmax=None) -> None:
        """row_argmax: a native.RowArgmax (greedy picks and the fitness check in one pass over
        the batch's logits); None: the same answers from torch.amax and torch.argmax."""
        self.row_argmax = row_argmax

    def _argmax_and_bad_rows(self, logits: torch.Tensor) -> tuple[list[int], list[bool]]:
        if self.row_argmax is not None:
            index, fit = self.row_argmax(logits)
            return index.tolist(), (~fit).tolist()
        # A row's max is NaN if any logit is, +inf if any is, -inf if all are: the model produced
        # garbage for that row (one reduction; a -inf logit alone is just a mask).
        bad_rows = (~torch.isfinite(logits.amax(dim=-1))).tolist()
        return torch.argmax(logits, dim=-1).tolist(), bad_rows

    def sample(
        self,
        logits: torch.Tensor,  # [S, vocab]
        params: list[SamplingParams],
        seeds: list[int],
        indices: list[int],  # how many tokens each request has generated so far
    ) -> list[int | SampleError]:
        """One token per row, or a SampleError for a row that cannot be sampled."""
        logits = logits.float()
        argmax, bad_rows = self._argmax_and_bad_rows(logits)  # one pass for every row
        tokens: list[int | SampleError] = list(argmax)
        for row, p in enumerate(params):
            if bad_rows[row]:
                tokens[row] = SampleError("the model produced non-finite logits")
            elif not p.greedy:
                tokens[row] = self._sample_row(logits[row], p, seeds[row], indices[row])
        return tokens

    @staticmethod
    def _sample_row(logits: torch.Tensor, params: SamplingParams, seed: int, index: int) -> int | SampleError:
        try:
            return sample_one(logits, params, seed, index)
        except Exception as exc:  # noqa: BLE001 - one row's failure must not fail the batch
            _log.exception("sampling failed for one row (%s)", params)
            return SampleError(f"sampling failed: {exc!r}")
