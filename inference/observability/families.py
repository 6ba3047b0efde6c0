"""The platform's metric families (names, help, labels, histogram buckets).

Counters and histograms are added to in Redis by any API process (see `store.py`) and read
back through a prometheus_client collector, so every process's /metrics shows the whole
platform. Durations are in seconds (Prometheus' base unit).
"""
from __future__ import annotations

from dataclasses import dataclass

COUNTER = "counter"
HISTOGRAM = "histogram"


@dataclass(frozen=True)
class Family:
    name: str  # without `_total` for counters (prometheus_client adds it)
    kind: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()  # upper bounds, ascending; +Inf is implied


MODEL_LABELS = ("model", "model_version", "tier")

TTFT = Family("llmp_request_ttft_seconds", HISTOGRAM,
              "Time from arrival to the first token, per request that produced one.",
              MODEL_LABELS,
              (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0))
TPOT = Family("llmp_request_time_per_output_token_seconds", HISTOGRAM,
              "Mean time between output tokens after the first, per request with two or more.",
              MODEL_LABELS,
              (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5))
E2E = Family("llmp_request_e2e_latency_seconds", HISTOGRAM,
             "Time from arrival to the end of the generation (any outcome).",
             MODEL_LABELS,
             (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0))
ADMISSION_WAIT = Family("llmp_request_admission_wait_seconds", HISTOGRAM,
                        "Time from arrival to a slot in the admission queue, per admitted request.",
                        MODEL_LABELS,
                        (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0))
GENERATIONS = Family("llmp_generation_requests", COUNTER,
                     "Generations that reached the router, by endpoint and outcome "
                     "(ok, failed, cancelled, rejected).",
                     ("endpoint", *MODEL_LABELS, "status"))
PROMPT_TOKENS = Family("llmp_prompt_tokens", COUNTER, "Prompt tokens of generations.",
                       MODEL_LABELS)
CACHED_TOKENS = Family("llmp_cached_prompt_tokens", COUNTER,
                       "Prompt tokens the replica served from its prefix cache.", MODEL_LABELS)
OUTPUT_TOKENS = Family("llmp_generation_tokens", COUNTER, "Output tokens of generations.",
                       MODEL_LABELS)
HTTP_REQUESTS = Family("llmp_http_requests", COUNTER,
                       "HTTP requests answered, by route pattern, method and status.",
                       ("route", "method", "status"))
HTTP_DURATION = Family("llmp_http_request_duration_seconds", HISTOGRAM,
                       "Time from the request to the response's headers (a stream's body "
                       "is not included), by route pattern and method.",
                       ("route", "method"),
                       (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                        10.0, 30.0, 60.0))
REFUSALS = Family("llmp_refusals", COUNTER,
                  "Requests answered with an error, by route, status and reason (the error "
                  "body's `code`: rate_limit_exceeded, queue_full, invalid_api_key, ...).",
                  ("route", "status", "reason"))

ALL = (TTFT, TPOT, E2E, ADMISSION_WAIT, GENERATIONS, PROMPT_TOKENS, CACHED_TOKENS,
       OUTPUT_TOKENS, HTTP_REQUESTS, HTTP_DURATION, REFUSALS)
