"""GET /metrics: Prometheus text format, for loopback clients and holders of METRICS_TOKEN.

The platform's request metrics (inference/observability) render through prometheus_client;
the admission queue's and the router's families follow in the same exposition.

Invariant: a client that is neither on loopback (when settings.METRICS_ALLOW_LOOPBACK) nor
sends `Authorization: Bearer <METRICS_TOKEN>` (compared in constant time; an empty token
matches nothing) gets 403 and learns nothing about queues, tenants' load or replicas.
REMOTE_ADDR is the connecting socket's address: behind a proxy on the same host every client
looks local, so set METRICS_ALLOW_LOOPBACK=false there and give the scraper the token.
"""
from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from django.http import HttpResponse

from inference.container import current_container
from inference.errors import Forbidden
from inference.metrics import admission_metrics
from inference.observability.buffer import current_buffer
from inference.observability.collector import render
from inference.observability.store import MetricStore
from tenants.auth import bearer_token


def _is_loopback(address: str | None) -> bool:
    try:
        return ipaddress.ip_address(address or "").is_loopback
    except ValueError:
        return False


def may_read_metrics(remote_addr: str | None, authorization: str | None) -> bool:
    if settings.METRICS_ALLOW_LOOPBACK and _is_loopback(remote_addr):
        return True
    token = bearer_token(authorization) or ""
    expected = settings.METRICS_TOKEN
    return bool(expected) and hmac.compare_digest(token.encode(), expected.encode())


async def metrics_view(request):
    if not may_read_metrics(request.META.get("REMOTE_ADDR"), request.headers.get("Authorization")):
        return Forbidden("The metrics are for loopback clients and holders of the metrics "
                         "token ('Authorization: Bearer <METRICS_TOKEN>').",
                         code="metrics_forbidden").to_response()
    container = current_container()
    await current_buffer().flush()  # this process's samples first: a scrape is never behind it
    snapshot = await MetricStore(container.redis, container.key_prefix).snapshot()
    body = render(snapshot).decode("utf-8")
    body += await admission_metrics(container.redis, container.admission)
    body += await container.router.state.stats.prometheus(container.router.state.circuit)
    return HttpResponse(body, content_type="text/plain; version=0.0.4; charset=utf-8")
