"""A time-of-day profile of request rates, learned from recorded samples.

The period (a day; minutes in the benchmark's compressed day) is cut into bins; a bin's rate is
the mean of the samples that fell into it over past periods. `peak(start, end)` is the highest
binned rate over a coming window, which the autoscaler sizes the fleet for: a replica started
now is ready after the version's load time, so the window starts there.

Pure: times are plain epoch seconds, so tests and the benchmark drive it with their own clock.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class TimeOfDayProfile:
    period_s: float
    bin_s: float
    _sums: list[float] = field(default_factory=list)
    _counts: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.period_s <= 0 or self.bin_s <= 0:
            raise ValueError("period and bin must be positive")
        num_bins = max(1, math.ceil(self.period_s / self.bin_s))
        self._sums = [0.0] * num_bins
        self._counts = [0] * num_bins

    @property
    def num_bins(self) -> int:
        return len(self._sums)

    def _bin(self, t: float) -> int:
        return int((t % self.period_s) // self.bin_s) % self.num_bins

    def add(self, t: float, rate_rps: float) -> None:
        """A sample whose window ended at `t` (it is binned by its midpoint's caller)."""
        b = self._bin(t)
        self._sums[b] += rate_rps
        self._counts[b] += 1

    def rate_at(self, t: float) -> float | None:
        b = self._bin(t)
        return self._sums[b] / self._counts[b] if self._counts[b] else None

    def peak(self, start: float, end: float) -> float:
        """The highest learned rate in [start, end] (0 where nothing was learned)."""
        rates = []
        t = start
        while t <= end:
            rates.append(self.rate_at(t) or 0.0)
            t += self.bin_s
        rates.append(self.rate_at(end) or 0.0)
        return max(rates)


def build_profile(samples: list[tuple[float, float, float]], period_s: float,
                  bin_s: float) -> TimeOfDayProfile:
    """`samples`: (window end as epoch seconds, window length s, requests). Each is binned at
    its window's midpoint."""
    profile = TimeOfDayProfile(period_s, bin_s)
    for end, window_s, num_requests in samples:
        if window_s > 0:
            profile.add(end - window_s / 2, num_requests / window_s)
    return profile
