"""python -m benchmarks.metering [--out FILE.json]: what metering costs and how fast billing is.

1. `events_per_s`: usage events the billing consumer moves from the Redis stream into
   PostgreSQL (XREADGROUP, one multi-row INSERT ... ON CONFLICT DO NOTHING per batch, XACK +
   XDEL), from a stream preloaded with `--events` events (target >= 2,000/s). For scale, the
   same with batches of one (`events_per_s_unbatched`, fewer events).
2. `request_overhead_ms`: in one process, `POST /v1/generate` through the platform (Django's
   ASGI handler, the real router, gRPC to a zero-cost fake Triton replica), in alternating
   rounds with metering on (the real recorder: XADD to Redis) and off (a recorder that does
   nothing); `request_overhead_ms` is the median over rounds of (median with - median
   without) in that round, so slow drift of a shared machine cancels. `record_ms_p50` /
   `_p99` time the recorder call alone (one XADD round trip).

PostgreSQL and Redis as `make serve` finds them; a `llm_platform_bench` database.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.django_env import setup_django  # noqa: E402
from scripts.services import ensure_database, ensure_services  # noqa: E402

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


def fixtures(num_requests: int):
    """A tenant whose limits fit the benchmark's load (it measures metering, not quotas: the
    tier's 600 requests/min would refuse a full run's ~810 requests with 429)."""
    from models_registry.services import ensure_model_version
    from tenants.services import create_api_key, create_tenant

    tenant = create_tenant(f"bench-{uuid.uuid4().hex[:6]}", "interactive")
    tenant.requests_per_minute = tenant.request_burst = max(600, 2 * num_requests)
    tenant.save(update_fields=["requests_per_minute", "request_burst"])
    issued = create_api_key(tenant)
    version = ensure_model_version("chat-small", 1, "fake", tokenizer="bytes",
                                   context_length=1024)
    return tenant, issued, version


def consumer_throughput(tenant, key, version, num_events: int, batch_size: int) -> float:
    import redis
    from django.conf import settings

    from billing.consumer import UsageConsumer
    from billing.events import UsageEvent
    from billing.stream import StreamKeys, send_batch

    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = StreamKeys(settings.REDIS_KEY_PREFIX + f"{batch_size}:")
    run = uuid.uuid4().hex[:8]
    now = time.time()
    events = [UsageEvent(f"bench-{run}-{i}", tenant.pk, key.pk, "chat-small", version.pk, None,
                         120, 32, 40, 15.0, 300.0, "ok", "stop", "generate", now)
              for i in range(num_events)]
    for i in range(0, num_events, 1000):
        send_batch(client, keys, events[i:i + 1000])
    consumer = UsageConsumer(client, keys, "bench", batch_size=batch_size)
    consumer.ensure_group()
    started = time.perf_counter()
    done = 0
    while done < num_events:
        handled = consumer.step(block_ms=0)
        if not handled:
            raise RuntimeError("the stream ran dry early")
        done += handled
    elapsed = time.perf_counter() - started
    client.delete(keys.stream)
    client.close()
    return num_events / elapsed


async def _nothing_to_finish(results) -> None:
    return None


class NullRecorder:
    """The recorder's interface (billing.stream.UsageRecorder), recording nothing: the request
    path without metering, for the side-by-side cost."""

    async def record(self, event) -> None:
        return None

    def queue_pending(self, pipe, event, lease):
        return _nothing_to_finish

    def queue_final(self, batch, event, lease):
        return _nothing_to_finish

    async def close(self) -> None:
        return None


async def request_overhead(issued, version, rounds: int, per_round: int) -> dict:
    from asgiref.sync import sync_to_async
    from django.apps import apps
    from django.test import AsyncClient

    from billing.stream import build_recorder
    from models_registry.services import register_replica
    from tests.fakes.triton_server import start_fake

    from models_registry.models import Replica

    # Replicas registered by earlier runs in this database must not receive traffic.
    await Replica.objects.exclude(state="stopped").aupdate(state="stopped")
    fake = await start_fake()
    await sync_to_async(register_replica)(version, fake.grpc_address,
                                          metrics_address=fake.metrics_address)
    config = apps.get_app_config("billing")
    loop = asyncio.get_running_loop()
    client = AsyncClient()
    headers = {"Authorization": f"Bearer {issued.raw_key}"}
    real = build_recorder()
    null = NullRecorder()
    latencies: dict[str, list[float]] = {"on": [], "off": []}

    async def one(mode: str) -> None:
        config.recorders.set(loop, real if mode == "on" else null)
        started = time.perf_counter()
        response = await client.post("/v1/generate", BODY, content_type="application/json",
                                     headers=headers)
        latencies[mode].append((time.perf_counter() - started) * 1000.0)
        assert response.status_code == 200, response.content

    for _ in range(5):  # warm-up: connections, caches
        await one("on")
        await one("off")
    latencies = {"on": [], "off": []}
    round_diffs = []  # per round: median with - median without (paired, so drift cancels)
    for index in range(rounds):
        medians = {}
        for mode in (("on", "off") if index % 2 == 0 else ("off", "on")):
            start = len(latencies[mode])
            for _ in range(per_round):
                await one(mode)
            medians[mode] = statistics.median(latencies[mode][start:])
        round_diffs.append(medians["on"] - medians["off"])

    from tests.support.billing import event as make_event

    record_ms = []
    for _ in range(500):
        e = make_event(issued.api_key.tenant_id, issued.api_key.pk, version.pk)
        started = time.perf_counter()
        await real.record(e)
        record_ms.append((time.perf_counter() - started) * 1000.0)
    await real.close()
    await fake.stop()
    on, off = statistics.median(latencies["on"]), statistics.median(latencies["off"])
    record_ms.sort()
    return {"request_ms_p50_with_metering": round(on, 3),
            "request_ms_p50_without_metering": round(off, 3),
            "request_overhead_ms": round(statistics.median(round_diffs), 3),
            "request_overhead_ms_of_overall_medians": round(on - off, 3),
            "record_ms_p50": round(record_ms[len(record_ms) // 2], 3),
            "record_ms_p99": round(record_ms[int(len(record_ms) * 0.99)], 3),
            "num_requests_each": len(latencies["on"])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--per-round", type=int, default=20)
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run (seconds) that only proves the benchmark still works")
    args = parser.parse_args()
    if args.smoke:
        args.events, args.batch_size, args.rounds, args.per_round = 200, 50, 2, 2
    num_unbatched = 50 if args.smoke else 1000
    services = ensure_services(REPO / "var", log=lambda *_: None)
    try:
        database_url = urlparse(services.database_url)._replace(
            path="/llm_platform_bench").geturl()
        ensure_database(database_url)
        setup_django(database_url, services.redis_url, REGISTRY_CACHE_TTL_SECONDS="1")
        tenant, issued, version = fixtures(10 + 2 * args.rounds * args.per_round)
        batched = consumer_throughput(tenant, issued.api_key, version, args.events,
                                      args.batch_size)
        unbatched = consumer_throughput(tenant, issued.api_key, version, num_unbatched, 1)
        overhead = asyncio.run(request_overhead(issued, version, args.rounds, args.per_round))
    finally:
        services.stop()
    result = {
        "events_per_s": round(batched, 1),
        "events_per_s_target": 2000,
        "num_events": args.events,
        "batch_size": args.batch_size,
        "events_per_s_unbatched": round(unbatched, 1),
        **overhead,
        "cpu_count": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
