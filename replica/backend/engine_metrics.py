"""EngineMetrics: the engine's gauges and counters on Triton's metrics port.

Triton's own `nv_inference_*` metrics do not see streaming work, so the router and autoscaler read
these instead. Names (labels: model, version):

  replica_running_seqs, replica_waiting_seqs            gauges
  replica_kv_free_blocks, replica_kv_total_blocks       gauges (free: cached prefixes included)
  replica_kv_free_uncached_blocks                       gauge: free without evicting a prefix
  replica_prefix_cache_hit_tokens_total                 counter
  replica_prompt_tokens_total                           counter
  replica_generated_tokens_total                        counter
  replica_preemptions_total                             counter
  replica_engine_info                                   gauge, always 1; labels also dtype and
                                                        quantization: what the engine runs
  replica_engine_alive                                  gauge: 1 while the engine loop runs, 0
                                                        once it died (the replica serves nothing)

Invariants: every MetricFamily stays referenced for the model's lifetime (a collected family breaks
its metrics); `close()` deletes the metrics before their families (else the stub may crash on exit).
"""
from __future__ import annotations

from typing import Any

# metric name -> (EngineStats attribute, kind, help)
GAUGES = {
    "replica_running_seqs": ("num_running", "Sequences in the running batch"),
    "replica_waiting_seqs": ("num_waiting", "Sequences waiting to be scheduled"),
    "replica_kv_free_blocks": ("num_free_blocks", "Free KV cache blocks (cached prefixes included)"),
    "replica_kv_free_uncached_blocks": ("num_free_uncached_blocks",
                                        "Free KV cache blocks holding no cached prefix"),
    "replica_kv_total_blocks": ("num_total_blocks", "Total KV cache blocks"),
}
COUNTERS = {
    "replica_prefix_cache_hit_tokens_total": ("prefix_hit_tokens", "Prompt tokens served from the prefix cache"),
    "replica_prompt_tokens_total": ("prompt_tokens",
                                    "Prompt tokens prefilled (prefix-cache hits included, "
                                    "recompute not counted again): what requests are billed"),
    "replica_generated_tokens_total": ("generated_tokens", "Tokens generated"),
    "replica_preemptions_total": ("num_preemptions", "Sequences preempted (recompute)"),
}

INFO = "replica_engine_info"
ALIVE = "replica_engine_alive"


class EngineMetrics:
    def __init__(self, pb_utils: Any, labels: dict[str, str], info: dict[str, str]) -> None:
        family = pb_utils.MetricFamily
        self._families: dict[str, Any] = {}
        self._families[INFO] = family(name=INFO, description="What the engine runs (labels); always 1",
                                      kind=family.GAUGE)
        self._info = self._families[INFO].Metric(labels={**labels, **info})
        self._info.set(1.0)
        self._families[ALIVE] = family(name=ALIVE, description="1 while the engine loop runs, 0 once it died",
                                       kind=family.GAUGE)
        self._alive = self._families[ALIVE].Metric(labels=labels)
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
