"""A prometheus_client collector over one `MetricStore.snapshot()`.

prometheus_client's own metric objects live in one process; the platform's counters span
processes (in Redis), so /metrics reads a snapshot asynchronously and renders it through this
collector: the exposition format, escaping and the `_total`/`_bucket` conventions are the
library's.
"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.exposition import generate_latest

from inference.observability.families import ALL, COUNTER
from inference.observability.store import HistogramSample


def _le(bound: float) -> str:
    return f"{bound:g}"


class SnapshotCollector(Collector):
    def __init__(self, snapshot: dict[str, dict]):
        self._snapshot = snapshot

    def collect(self):
        for family in ALL:
            samples = self._snapshot.get(family.name, {})
            if family.kind == COUNTER:
                metric = CounterMetricFamily(family.name, family.help, labels=family.labels)
                for labels, value in sorted(samples.items()):
                    metric.add_metric(list(labels), value)
            else:
                metric = HistogramMetricFamily(family.name, family.help, labels=family.labels)
                for labels, sample in sorted(samples.items()):
                    metric.add_metric(list(labels), _cumulative(family.buckets, sample),
                                      sample.sum)
            yield metric


def _cumulative(buckets: tuple[float, ...], sample: HistogramSample) -> list[tuple[str, float]]:
    total = 0
    rows = []
    for bound, count in zip([*map(_le, buckets), "+Inf"], sample.bucket_counts):
        total += count
        rows.append((bound, total))
    return rows


def render(snapshot: dict[str, dict]) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SnapshotCollector(snapshot))
    return generate_latest(registry)
