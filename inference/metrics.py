"""Prometheus text for the platform's shared state: admission queue depth, slots in use,
wait-time histogram and refusals per model (the admission queue is per model; all read from
Redis, so any process's /metrics shows the whole fleet's platform side)."""
from __future__ import annotations

from inference.admission import WAIT_BUCKETS_MS, AdmissionQueue


async def admission_metrics(redis, queue: AdmissionQueue) -> str:
    lines = [
        "# HELP llmp_admission_queue_depth Requests waiting in the admission queue.",
        "# TYPE llmp_admission_queue_depth gauge",
        "# HELP llmp_admission_slots_in_use Admitted requests holding a slot.",
        "# TYPE llmp_admission_slots_in_use gauge",
        "# HELP llmp_admission_wait_seconds Time from arrival to admission.",
        "# TYPE llmp_admission_wait_seconds histogram",
        "# HELP llmp_admission_rejected_total Requests refused with 503 (full, timeout).",
        "# TYPE llmp_admission_rejected_total counter",
    ]
    models = sorted(m.decode() for m in await redis.smembers(queue.models_key()))
    for model in models:
        waiting, running, _, stats_key, _ = queue.keys(model)
        label = f'model="{model}"'
        depth = await redis.hlen(waiting)
        in_use = await redis.zcard(running)
        stats = {k.decode(): v.decode() for k, v in (await redis.hgetall(stats_key)).items()}
        lines.append(f"llmp_admission_queue_depth{{{label}}} {depth}")
        lines.append(f"llmp_admission_slots_in_use{{{label}}} {in_use}")
        cumulative = 0
        for i, bound in enumerate([*WAIT_BUCKETS_MS, None], start=1):
            cumulative += int(stats.get(f"b{i}", 0))
            le = "+Inf" if bound is None else f"{bound / 1000:g}"
            lines.append(f'llmp_admission_wait_seconds_bucket{{{label},le="{le}"}} {cumulative}')
        lines.append(f"llmp_admission_wait_seconds_sum{{{label}}} "
                     f"{float(stats.get('sum_ms', 0)) / 1000:g}")
        lines.append(f"llmp_admission_wait_seconds_count{{{label}}} {int(stats.get('count', 0))}")
        for reason in ("full", "timeout"):
            lines.append(f'llmp_admission_rejected_total{{{label},reason="{reason}"}} '
                         f"{int(stats.get('rejected_' + reason, 0))}")
    return "\n".join(lines) + "\n"
