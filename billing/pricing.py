"""Prices in effect at a time, and the exact cost of usage (pure; Decimal only, no rounding)."""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Iterable

ZERO = Decimal(0)


@dataclass(frozen=True)
class PriceTerms:
    input_per_million: Decimal
    output_per_million: Decimal
    cached_input_per_million: Decimal | None = None

    def cost(self, input_tokens: int, cached_tokens: int, output_tokens: int) -> Decimal:
        """Exact: (uncached input x input price + cached x cached price + output x output
        price) / 10^6. `input_tokens` includes the cached ones."""
        cached_price = (self.input_per_million if self.cached_input_per_million is None
                        else self.cached_input_per_million)
        cached = min(cached_tokens, input_tokens)
        per_million = ((input_tokens - cached) * self.input_per_million
                       + cached * cached_price + output_tokens * self.output_per_million)
        return per_million.scaleb(-6)


FREE = PriceTerms(ZERO, ZERO, None)


class PriceBook:
    """Every price of some model versions, looked up by (version, time): the price whose
    `effective_from` is the latest one <= the time. Before a version's first price: FREE."""

    def __init__(self, prices: Iterable[tuple[int, datetime, PriceTerms]]):
        by_version: dict[int, list[tuple[datetime, PriceTerms]]] = {}
        for version_id, start, terms in prices:
            by_version.setdefault(version_id, []).append((start, terms))
        self._starts: dict[int, list[datetime]] = {}
        self._terms: dict[int, list[PriceTerms]] = {}
        for version_id, entries in by_version.items():
            entries.sort(key=lambda e: e[0])
            self._starts[version_id] = [start for start, _ in entries]
            self._terms[version_id] = [terms for _, terms in entries]

    def at(self, version_id: int, when: datetime) -> PriceTerms:
        starts = self._starts.get(version_id)
        if not starts:
            return FREE
        index = bisect.bisect_right(starts, when) - 1
        return FREE if index < 0 else self._terms[version_id][index]
