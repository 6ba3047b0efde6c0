"""Token sampling: greedy, temperature, top-k, top-p, with per-request reproducible seeds.

The whole batch in one pass: greedy picks (and the fitness check) for every row at once, then
temperature / top-k / top-p for all non-greedy rows as batched tensor ops and one uniform draw
per row through the inverse CDF (`sample_rows`). A seeded request draws its i-th token from a
generator seeded by (seed, i), so its output depends only on its seed and its own logits: not on
batch composition, step timing or preemption and recompute. Requests without a seed share one
generator (the sampler's), one draw per step.

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
from dataclasses import dataclass

import torch

from replica.engine.sampling_params import SamplingParams

_MASK64 = (1 << 63) - 1
NUCLEUS_CANDIDATES = 1024  # top-p looks among this many most likely tokens before sorting a row whole
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleError:
    """One row could not be sampled; its request fails with an internal error."""

    message: str


def _generator(seed: int, index: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed((seed * 1_000_003 + index * 7_919 + 1) & _MASK64)
    return g


def sample_rows(
    logits: torch.Tensor,  # [R, vocab] float32, finite or -inf (checked by the caller)
    params: list[SamplingParams],  # none greedy
    seeds: list[int | None],
    indices: list[int],
    batch_generator: torch.Generator,
    greedy: list[int],  # each row's argmax: the fallback of a degenerate distribution
) -> list[int]:
    """Temperature, top-k and top-p for all rows in one pass of batched tensor ops, then one
    uniform draw per row through the inverse CDF. A seeded row draws from its own (seed, index)
    generator, so its token depends only on its seed and its own logits; the other rows share
    one draw from `batch_generator`."""
    rows, vocab = logits.shape
    scaled = logits / torch.tensor([p.temperature for p in params], dtype=torch.float32).unsqueeze(1)
    ks = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
    if any(ks):
        kth = torch.topk(scaled, max(ks), dim=-1).values.gather(1, torch.tensor([[max(k, 1) - 1] for k in ks]))
        kth[torch.tensor([k == 0 for k in ks])] = float("-inf")  # rows without top-k keep all
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    u = torch.empty(rows, dtype=torch.float32)
    unseeded = [i for i, s in enumerate(seeds) if s is None]
    if unseeded:
        u[unseeded] = torch.rand(len(unseeded), generator=batch_generator)
    for i, seed in enumerate(seeds):
        if seed is not None:
            u[i] = torch.rand(1, generator=_generator(seed, indices[i]))[0]
    tokens = [0] * rows
    nucleus = [i for i, p in enumerate(params) if p.top_p < 1.0]
    whole = [i for i, p in enumerate(params) if p.top_p >= 1.0]
    if whole:
        _draw(probs[whole], u[whole], None, [greedy[i] for i in whole], tokens, whole)
    if nucleus:
        # The nucleus usually lies within the most likely few hundred tokens: look there first
        # (topk), and sort the whole vocabulary only for rows whose candidates fall short of top_p.
        top_p = torch.tensor([[params[i].top_p] for i in nucleus], dtype=torch.float32)
        sub = probs[nucleus]
        cand_probs, cand_order = torch.topk(sub, min(vocab, NUCLEUS_CANDIDATES), dim=-1, sorted=True)
        enough = (cand_probs.sum(-1, keepdim=True) >= top_p).squeeze(1).tolist()
        short = [j for j, ok in enumerate(enough) if not ok]
        groups = [([j for j, ok in enumerate(enough) if ok], cand_probs, cand_order)]
        if short:
            groups.append((short, *torch.sort(sub[short], dim=-1, descending=True, stable=True)))
        for members, ranked, order in groups:
            if not members:
                continue
            if len(members) < ranked.shape[0]:
                ranked, order = ranked[members], order[members]
            # keep the smallest set whose mass reaches top_p (the first token is always kept)
            ranked = ranked.masked_fill(torch.cumsum(ranked, dim=-1) - ranked >= top_p[members], 0.0)
            rows = [nucleus[j] for j in members]
            _draw(ranked, u[rows], order, [greedy[i] for i in rows], tokens, rows)
    return tokens


def _draw(dist: torch.Tensor, u: torch.Tensor, order: torch.Tensor | None, greedy: list[int],
          tokens: list[int], rows: list[int]) -> None:
    """Row i's token: the first index where dist's running sum exceeds u[i] x its total (so never
    a zero-probability one), mapped through `order`; a row with no finite positive mass (NaN from
    an overflowing temperature, all masked) takes its greedy token."""
    cum = torch.cumsum(dist, dim=-1)
    total = cum[:, -1]
    fit = (torch.isfinite(total) & (total > 0)).tolist()
    # strictly below the total, whatever the rounding of u x total: the pick is a real token
    target = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))
    picks = torch.searchsorted(cum, target.unsqueeze(1), right=True).clamp_(max=dist.shape[1] - 1)
    if order is not None:
        picks = order.gather(1, picks)
    for j, (row, pick) in enumerate(zip(rows, picks.squeeze(1).tolist())):
        tokens[row] = pick if fit[j] else greedy[j]


def sample_one(logits: torch.Tensor, params: SamplingParams, seed: int | None, index: int,
               batch_generator: torch.Generator | None = None) -> int:
    """One request's token (the batch pass on one row). logits: [vocab], finite or -inf."""
    logits = logits.float()
    greedy = int(torch.argmax(logits))
    if params.greedy:
        return greedy
    return sample_rows(logits.unsqueeze(0), [params], [seed], [index], batch_generator or torch.Generator(), [greedy])[0]


class Sampler:
    def __init__(self, row_argmax=None, seed: int = 0) -> None:
        """row_argmax: a native.RowArgmax (greedy picks and the fitness check in one pass over
        the batch's logits); None: the same answers from torch.amax and torch.argmax. `seed`:
        of the generator that requests without a seed of their own share."""
        self.row_argmax = row_argmax
        self.batch_generator = torch.Generator().manual_seed(seed)

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
        seeds: list[int | None],  # None: the request set no seed (it draws from the batch generator)
        indices: list[int],  # how many tokens each request has generated so far
    ) -> list[int | SampleError]:
        """One token per row, or a SampleError for a row that cannot be sampled."""
        logits = logits.float()
        argmax, bad_rows = self._argmax_and_bad_rows(logits)  # one pass for every row
        tokens: list[int | SampleError] = list(argmax)
        random_rows = []
        for row, p in enumerate(params):
            if bad_rows[row]:
                tokens[row] = SampleError("the model produced non-finite logits")
            elif not p.greedy:
                random_rows.append(row)
        if not random_rows:
            return tokens
        try:
            picks = sample_rows(logits[random_rows], [params[r] for r in random_rows], [seeds[r] for r in random_rows],
                                [indices[r] for r in random_rows], self.batch_generator,
                                [argmax[r] for r in random_rows])
        except Exception:  # noqa: BLE001 - one row's failure must not fail the batch: row by row
            _log.exception("sampling the batch failed; sampling its rows one by one")
            picks = [self._sample_row(logits[r], params[r], seeds[r], indices[r]) for r in random_rows]
        for row, pick in zip(random_rows, picks):
            tokens[row] = pick
        return tokens

    def _sample_row(self, logits: torch.Tensor, params: SamplingParams, seed: int | None, index: int) -> int | SampleError:
        try:
            return sample_one(logits, params, seed, index, self.batch_generator)
        except Exception as exc:  # noqa: BLE001 - one row's failure must not fail the row's batch
            _log.exception("sampling failed for one row (%s)", params)
            return SampleError(f"sampling failed: {exc!r}")
