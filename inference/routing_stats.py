"""Routing counters per model version, replica and policy, in Redis (so any process's /metrics
shows the whole fleet) and their Prometheus text.

Counters: requests routed, prompt tokens routed and prompt tokens the replica served from its
prefix cache (as it reported them on the final response), retries (a replica failed before
the first token and the request went elsewhere; labelled with the replica that failed),
circuit openings. Gauge: each replica's circuit state (0 closed, 1 open, 2 half-open).
"""
from __future__ import annotations

from inference.circuit import STATE_VALUES, CircuitBreaker
from common import redis_keys

COUNTERS = {
    "routed": ("llmp_router_requests_routed_total", "Requests sent to a replica."),
    "prompt_tokens": ("llmp_router_prompt_tokens_total", "Prompt tokens of requests served."),
    "hit_tokens": ("llmp_router_prefix_hit_tokens_total",
                   "Prompt tokens the replica served from its prefix cache."),
    "retries": ("llmp_router_retries_total",
                "Requests retried elsewhere after this replica failed before the first token."),
    "failures": ("llmp_router_replica_failures_total",
                 "Replica faults (before or after the first token)."),
    "circuit_opened": ("llmp_router_circuit_opened_total", "Times the replica's circuit opened."),
}


class RoutingStats:
    def __init__(self, redis, key_prefix: str):
        self._redis = redis
        self._prefix = key_prefix

    def models_key(self) -> str:
        return redis_keys.routing_models(self._prefix)

    def key(self, model_version_id: int) -> str:
        return redis_keys.routing_stats(self._prefix, model_version_id)

    async def add(self, model_version_id: int, replica_id: int, policy: str,
                  **counts: int) -> None:
        pipe = self._redis.pipeline(transaction=False)
        self.queue_add(pipe, model_version_id, replica_id, policy, **counts)
        await pipe.execute()

    def queue_add(self, pipe, model_version_id: int, replica_id: int, policy: str,
                  **counts: int) -> None:
        """`add` queued on `pipe` (the router sends it with the lease it takes)."""
        pipe.execute_command("SADD", self.models_key(), model_version_id)
        for name, value in counts.items():
            if name not in COUNTERS:
                raise ValueError(f"unknown routing counter {name!r}")
            if value:
                pipe.execute_command("HINCRBY", self.key(model_version_id),
                                     f"{name}|{replica_id}|{policy}", value)

    async def prometheus(self, circuit: CircuitBreaker) -> str:
        samples: dict[str, list[str]] = {name: [] for name, _ in COUNTERS.values()}
        replica_ids: set[tuple[int, int]] = set()
        model_version_ids = sorted(int(m) for m in await self._redis.smembers(self.models_key()))
        for mv in model_version_ids:
            rows = await self._redis.hgetall(self.key(mv))
            for field, value in sorted((k.decode(), int(v)) for k, v in rows.items()):
                counter, replica_id, policy = field.split("|", 2)
                replica_ids.add((mv, int(replica_id)))
                labels = f'model_version="{mv}",replica="{replica_id}",policy="{policy}"'
                samples[COUNTERS[counter][0]].append(f"{COUNTERS[counter][0]}{{{labels}}} {value}")
        lines = []
        for name, help_text in COUNTERS.values():  # each family one group: HELP, TYPE, samples
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", *samples[name]]
        lines += ["# HELP llmp_router_circuit_state Replica circuit: 0 closed, 1 open, 2 half-open.",
                  "# TYPE llmp_router_circuit_state gauge"]
        ordered = sorted(replica_ids)
        states = await circuit.states([rid for _, rid in ordered]) if ordered else {}
        for mv, rid in ordered:
            lines.append(f'llmp_router_circuit_state{{model_version="{mv}",replica="{rid}"}} '
                         f"{STATE_VALUES[states[rid]]}")
        return "\n".join(lines) + "\n"
