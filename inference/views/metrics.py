"""GET /metrics: Prometheus text format.

The platform's request metrics (inference/observability) render through prometheus_client;
the admission queue's and the router's families follow in the same exposition.
"""
from __future__ import annotations

from django.http import HttpResponse

from inference.container import current_container
from inference.metrics import admission_metrics
from inference.observability.buffer import current_buffer
from inference.observability.collector import render
from inference.observability.store import MetricStore


async def metrics_view(request):
    container = current_container()
    await current_buffer().flush()  # this process's samples first: a scrape is never behind it
    snapshot = await MetricStore(container.redis, container.key_prefix).snapshot()
    body = render(snapshot).decode("utf-8")
    body += await admission_metrics(container.redis, container.admission)
    body += await container.router.state.stats.prometheus(container.router.state.circuit)
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")
