"""VllmMetrics: the replica's state under vLLM's metric names, beside our own (engine_metrics).

The routers of the field (vLLM production-stack, llm-d, AIBrix) read vLLM's names from a
replica's /metrics; exporting them lets those routers place requests on our replicas. Label:
`model_name` (the Triton model name), as vLLM labels them.

  vllm:num_requests_running            gauge    sequences in the running batch
  vllm:num_requests_waiting            gauge    sequences waiting to be scheduled
  vllm:kv_cache_usage_perc             gauge    used KV blocks / all blocks (0..1)
  vllm:prefix_cache_queries_total      counter  prompt tokens looked up in the prefix cache
                                                (computed + served from the cache)
  vllm:prefix_cache_hits_total         counter  prompt tokens served from the prefix cache
  vllm:prompt_tokens_total             counter  prompt tokens computed
  vllm:generation_tokens_total         counter  tokens generated
  vllm:time_to_first_token_seconds     histogram  arrival (execute) to the first output sent
  vllm:inter_token_latency_seconds     histogram  between consecutive outputs of a request,
                                                  per output token

Threads: `arrived` runs on Triton's execute thread, everything else on the sender thread;
request timings live in a dict whose single-key operations are atomic under the GIL.
Invariants as engine_metrics: families stay referenced for the model's lifetime; `close()`
drops the metrics before their families.
"""
from __future__ import annotations

import time
from typing import Any, Callable

TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_QUERIES = "vllm:prefix_cache_queries_total"
PREFIX_HITS = "vllm:prefix_cache_hits_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"


def kv_usage(stats: Any) -> float:
    total = int(stats.num_total_blocks)
    return 0.0 if total <= 0 else max(0.0, min(1.0, 1.0 - int(stats.num_free_blocks) / total))


# counter name -> cumulative value from EngineStats
COUNTER_SOURCES: dict[str, Callable[[Any], int]] = {
    PREFIX_QUERIES: lambda s: int(s.prompt_tokens) + int(s.prefix_hit_tokens),
    PREFIX_HITS: lambda s: int(s.prefix_hit_tokens),
    PROMPT_TOKENS: lambda s: int(s.prompt_tokens),
    GENERATION_TOKENS: lambda s: int(s.generated_tokens),
}


class VllmMetrics:
    def __init__(self, pb_utils: Any, model_name: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        family = pb_utils.MetricFamily
        labels = {"model_name": model_name}
        self._clock = clock
        self._families: dict[str, Any] = {}
        self._gauges: dict[str, Any] = {}
        self._counters: dict[str, Any] = {}
        self._last_counts: dict[str, int] = {}

        def make(name: str, help_text: str, kind: Any) -> Any:
            self._families[name] = family(name=name, description=help_text, kind=kind)
            return self._families[name]

        for name, help_text in ((RUNNING, "Requests in the running batch"),
                                (WAITING, "Requests waiting to be scheduled"),
                                (KV_USAGE, "KV cache usage, 0 to 1")):
            self._gauges[name] = make(name, help_text, family.GAUGE).Metric(labels=labels)
        for name in COUNTER_SOURCES:
            self._counters[name] = make(name, name.split(":", 1)[1], family.COUNTER).Metric(
                labels=labels)
            self._last_counts[name] = 0
        self._ttft = make(TTFT, "Time to first token", family.HISTOGRAM).Metric(
            labels=labels, buckets=TTFT_BUCKETS)
        self._itl = make(ITL, "Time between output tokens", family.HISTOGRAM).Metric(
            labels=labels, buckets=ITL_BUCKETS)
        # request id -> [arrival, time of the last output (None before the first), tokens]
        self._timings: dict[str, list] = {}

    def update(self, stats: Any) -> None:
        self._gauges[RUNNING].set(float(stats.num_running))
        self._gauges[WAITING].set(float(stats.num_waiting))
        self._gauges[KV_USAGE].set(kv_usage(stats))
        for name, source in COUNTER_SOURCES.items():
            value = source(stats)
            delta = value - self._last_counts[name]
            if delta > 0:
                self._counters[name].increment(float(delta))
                self._last_counts[name] = value

    def arrived(self, request_id: str) -> None:
        self._timings[request_id] = [self._clock(), None, 0]

    def output(self, request_id: str, num_output_tokens: int, finished: bool) -> None:
        """An output of the request was sent (sender thread)."""
        timing = self._timings.get(request_id)
        if timing is None:
            return
        now = self._clock()
        new_tokens = num_output_tokens - timing[2]
        if new_tokens > 0:
            if timing[1] is None:
                self._ttft.observe(now - timing[0])
            else:
                gap = (now - timing[1]) / new_tokens
                for _ in range(min(new_tokens, 64)):
                    self._itl.observe(gap)
            timing[1], timing[2] = now, num_output_tokens
        if finished:
            self._timings.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        self._timings.pop(request_id, None)

    def close(self) -> None:
        self._timings.clear()
        self._gauges.clear()
        self._counters.clear()
        self._ttft = None
        self._itl = None
        self._families.clear()
