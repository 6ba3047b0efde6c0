"""Prometheus text for the platform's shared state: admission queue depth, slots in use,
wait-time histogram and refusals per model (the admission queue is per model; all read from
Redis, so any process's /metrics shows the whole fleet's platform side)."""
from __future__ import annotations

from inference.admission import WAIT_BUCKETS_MS, AdmissionQueue


# The admission metrics' names, defined once (the Grafana dashboard's test reads them here).
QUEUE_DEPTH = "llmp_admission_queue_depth"
SLOTS_IN_USE = "llmp_admission_slots_in_use"
WAIT_SECONDS = "llmp_admission_wait_seconds"
REJECTED = "llmp_admission_rejected_total"
HEADERS = (
    (QUEUE_DEPTH, "gauge", "Requests waiting in the admission queue."),
    (SLOTS_IN_USE, "gauge", "Admitted requests holding a slot."),
    (WAIT_SECONDS, "histogram", "Time from arrival to admission."),
    (REJECTED, "counter", "Requests refused with 503 (full, timeout)."),
)


async def admission_metrics(redis, queue: AdmissionQueue) -> str:
    lines = [line for name, kind, help_text in HEADERS
             for line in (f"# HELP {name} {help_text}", f"# TYPE {name} {kind}")]
    models = sorted(m.decode() for m in await redis.smembers(queue.models_key()))
    for model in models:
        waiting, running, _, stats_key, _ = queue.keys(model)
        label = f'model="{model}"'
        depth = await redis.hlen(waiting)
        in_use = await redis.zcard(running)
        stats = {k.decode(): v.decode() for k, v in (await redis.hgetall(stats_key)).items()}
        lines.append(f"{QUEUE_DEPTH}{{{label}}} {depth}")
        lines.append(f"{SLOTS_IN_USE}{{{label}}} {in_use}")
        cumulative = 0
        for i, bound in enumerate([*WAIT_BUCKETS_MS, None], start=1):
            cumulative += int(stats.get(f"b{i}", 0))
            le = "+Inf" if bound is None else f"{bound / 1000:g}"
            lines.append(f'{WAIT_SECONDS}_bucket{{{label},le="{le}"}} {cumulative}')
        lines.append(f"{WAIT_SECONDS}_sum{{{label}}} "
                     f"{float(stats.get('sum_ms', 0)) / 1000:g}")
        lines.append(f"{WAIT_SECONDS}_count{{{label}}} {int(stats.get('count', 0))}")
        for reason in ("full", "timeout"):
            lines.append(f'{REJECTED}{{{label},reason="{reason}"}} '
                         f"{int(stats.get('rejected_' + reason, 0))}")
    return "\n".join(lines) + "\n"
