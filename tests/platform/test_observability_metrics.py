"""Platform metrics: a real request through the API moves the right counters and histogram
buckets, read back by scraping /metrics and parsing it with prometheus_client's parser."""
import json

import pytest
from prometheus_client.parser import text_string_to_metric_families

from inference.observability import families as f
from inference.observability.collector import render
from inference.observability.store import Batch, MetricStore

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def scrape(client) -> dict[tuple[str, frozenset], float]:
    response = await client.get("/metrics")
    assert response.status_code == 200
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float:
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())), 0.0)


async def test_a_request_moves_its_histograms_and_counters(client, auth, ready_replica,
                                                           model_version):
    model = {"model": "chat-small", "model_version": str(model_version.pk),
             "tier": "interactive"}
    before = await scrape(client)
    response = await client.post("/v1/chat/completions", data=json.dumps(BODY),
                                 content_type="application/json", headers=auth)
    assert response.status_code == 200, response.content
    after = await scrape(client)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    usage = response.json()["usage"]
    assert delta("llmp_generation_requests_total", endpoint="chat", status="ok", **model) == 1
    assert delta("llmp_prompt_tokens_total", **model) == usage["prompt_tokens"]
    assert delta("llmp_generation_tokens_total", **model) == 4
    for name in ("llmp_request_ttft_seconds", "llmp_request_e2e_latency_seconds",
                 "llmp_request_time_per_output_token_seconds",
                 "llmp_request_admission_wait_seconds"):
        assert delta(f"{name}_count", **model) == 1, name
        assert delta(f"{name}_bucket", le="+Inf", **model) == 1, name
        assert delta(f"{name}_sum", **model) > 0 or name.endswith("admission_wait_seconds")
    # The TTFT observation sits in the first bucket at least as large as it (cumulative).
    ttft = delta("llmp_request_ttft_seconds_sum", **model)
    for bound in f.TTFT.buckets:
        expected = 1 if ttft <= bound else 0
        assert delta("llmp_request_ttft_seconds_bucket", le=f"{bound:g}", **model) == expected
    assert delta("llmp_http_requests_total", route="/v1/chat/completions", method="POST",
                 status="200") == 1
    assert delta("llmp_http_request_duration_seconds_count", route="/v1/chat/completions",
                 method="POST") == 1


async def test_refusals_by_status_and_reason(client, auth, ready_replica):
    before = await scrape(client)
    bad_key = await client.post("/v1/generate", data=json.dumps(BODY),
                                content_type="application/json",
                                headers={"Authorization": "Bearer llmp_00000000_bogus"})
    unknown = await client.post("/v1/generate", data=json.dumps({**BODY, "model": "nope"}),
                                content_type="application/json", headers=auth)
    assert (bad_key.status_code, unknown.status_code) == (401, 404)
    after = await scrape(client)
    for status, reason in (("401", "invalid_api_key"), ("404", "model_not_found")):
        labels = {"route": "/v1/generate", "status": status, "reason": reason}
        assert value(after, "llmp_refusals_total", **labels) - value(
            before, "llmp_refusals_total", **labels) == 1
    labels = {"route": "unmatched", "method": "GET", "status": "404"}
    await client.get("/no/such/path")
    assert value(await scrape(client), "llmp_http_requests_total", **labels) == value(
        after, "llmp_http_requests_total", **labels) + 1


async def test_histogram_bounds_are_inclusive_and_shared_across_store_instances(settings):
    import redis.asyncio as aioredis

    redis = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        prefix = settings.REDIS_KEY_PREFIX + "unit:"
        labels = {"model": "m", "model_version": "1", "tier": "t"}
        batch = Batch()
        batch.observe(f.TTFT, labels, 0.05)  # exactly a bound: counted in le="0.05"
        batch.observe(f.TTFT, labels, 1000.0)  # past the last bound: +Inf only
        await MetricStore(redis, prefix).write(batch)
        await MetricStore(redis, prefix).write(batch)  # a second "process"
        text = render(await MetricStore(redis, prefix).snapshot()).decode()
        samples = {(s.name, s.labels.get("le")): s.value
                   for family in text_string_to_metric_families(text) for s in family.samples
                   if s.name.startswith("llmp_request_ttft_seconds")}
        assert samples[("llmp_request_ttft_seconds_bucket", "0.025")] == 0
        assert samples[("llmp_request_ttft_seconds_bucket", "0.05")] == 2
        assert samples[("llmp_request_ttft_seconds_bucket", "80")] == 2
        assert samples[("llmp_request_ttft_seconds_bucket", "+Inf")] == 4
        assert samples[("llmp_request_ttft_seconds_count", None)] == 4
        assert samples[("llmp_request_ttft_seconds_sum", None)] == pytest.approx(2000.1)
    finally:
        await redis.aclose()


async def test_buffered_samples_reach_redis_in_the_background(settings):
    import asyncio

    import redis.asyncio as aioredis

    from inference.observability.buffer import MetricBuffer

    redis = aioredis.Redis.from_url(settings.REDIS_URL)
    try:
        store = MetricStore(redis, settings.REDIS_KEY_PREFIX + "buffer:")
        buffer = MetricBuffer(store, interval_s=0.01)
        labels = {"route": "/x", "method": "GET", "status": "200"}
        for _ in range(3):
            batch = Batch()
            batch.inc(f.HTTP_REQUESTS, labels)
            buffer.add(batch)  # no I/O here
        await asyncio.wait_for(buffer.scheduled_flush, 10)
        samples = (await store.snapshot())["llmp_http_requests"]
        assert samples == {("/x", "GET", "200"): 3.0}
        batch = Batch()
        batch.inc(f.HTTP_REQUESTS, labels, 2)
        buffer.add(batch)
        await buffer.flush()  # what /metrics does before its snapshot
        assert (await store.snapshot())["llmp_http_requests"] == {("/x", "GET", "200"): 5.0}
        await asyncio.wait_for(buffer.scheduled_flush, 10)  # an empty flush writes nothing
        assert (await store.snapshot())["llmp_http_requests"] == {("/x", "GET", "200"): 5.0}
    finally:
        await redis.aclose()
