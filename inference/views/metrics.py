"""GET /metrics: Prometheus text format."""
from __future__ import annotations

from django.http import HttpResponse

from inference.container import current_container
from inference.metrics import admission_metrics


async def metrics_view(request):
    container = current_container()
    body = await admission_metrics(container.redis, container.admission)
    body += await container.router.state.stats.prometheus(container.router.state.circuit)
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")
