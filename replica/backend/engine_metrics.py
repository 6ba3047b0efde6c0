"""EngineMetrics: the engine's gauges and counters on Triton's metrics port.

The names, what each exports and its help are defined once in `replica/metric_names.py` (the
platform reads them from there too): gauges and counters of the engine's statistics, plus
`replica_engine_info` (always 1; labels also dtype and quantization: what the engine runs) and
`replica_engine_alive` (1 while the engine loop runs, 0 once it died).

Invariants: every MetricFamily stays referenced for the model's lifetime (a collected family breaks
its metrics); `close()` deletes the metrics before their families (else the stub may crash on exit).
"""
from __future__ import annotations

from typing import Any

from replica.metric_names import COUNTERS, ENGINE_ALIVE, ENGINE_INFO, GAUGES


class EngineMetrics:
    def __init__(self, pb_utils: Any, labels: dict[str, str], info: dict[str, str]) -> None:
        family = pb_utils.MetricFamily
        self._families: dict[str, Any] = {}
        self._families[ENGINE_INFO] = family(name=ENGINE_INFO, kind=family.GAUGE,
                                             description="What the engine runs (labels); always 1")
        self._info = self._families[ENGINE_INFO].Metric(labels={**labels, **info})
        self._info.set(1.0)
        self._families[ENGINE_ALIVE] = family(
            name=ENGINE_ALIVE, kind=family.GAUGE, description="1 while the engine loop runs, 0 once it died")
        self._alive = self._families[ENGINE_ALIVE].Metric(labels=labels)
        self._alive.set(1.0)
        self._gauges: dict[str, Any] = {}  # stats attribute -> metric
        self._counters: dict[str, Any] = {}
        self._last_counts: dict[str, int] = {}
        for name, (attr, help_text) in GAUGES.items():
            self._families[name] = family(name=name, description=help_text, kind=family.GAUGE)
            self._gauges[attr] = self._families[name].Metric(labels=labels)
        for name, (attr, help_text) in COUNTERS.items():
            self._families[name] = family(name=name, description=help_text, kind=family.COUNTER)
            self._counters[attr] = self._families[name].Metric(labels=labels)
            self._last_counts[attr] = 0

    def update(self, stats: Any) -> None:
        for attr, metric in self._gauges.items():
            metric.set(float(getattr(stats, attr)))
        for attr, metric in self._counters.items():
            value = int(getattr(stats, attr))
            delta = value - self._last_counts[attr]
            if delta > 0:
                metric.increment(float(delta))
                self._last_counts[attr] = value

    def set_alive(self, alive: bool) -> None:
        if self._alive is not None:
            self._alive.set(1.0 if alive else 0.0)

    def close(self) -> None:
        self._info = None
        self._alive = None
        self._gauges.clear()
        self._counters.clear()
        self._families.clear()
