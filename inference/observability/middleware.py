"""RequestContextMiddleware: every HTTP request gets an id, a logging context and its metrics.

First in MIDDLEWARE. Per request: the id (request_ids.claim) is set for this task, bound to the
log context and sent back as `X-Request-Id`; when the view returns, the route pattern, method,
status and time to the response's headers are counted (families HTTP_REQUESTS, HTTP_DURATION),
and an error reply's `code` as a refusal reason (REFUSALS). Invariant: metrics and id claims are
best effort; a Redis failure never changes the reply.
"""
from __future__ import annotations

import logging
import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction

from inference.container import current_container
from inference.observability import families as f
from inference.observability import request_ids
from inference.observability.buffer import current_buffer
from inference.observability.store import Batch
from llm_platform.hot_settings import settings
from llm_platform.logging import bind_request_context, clear_request_context

logger = logging.getLogger(__name__)

UNMATCHED = "unmatched"
# Labels must stay few: any other method a client sends is counted as OTHER.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER = "other"


def route_of(request) -> str:
    match = getattr(request, "resolver_match", None)
    return "/" + match.route if match is not None and match.route else UNMATCHED


def error_code(response) -> str:
    """The refusal reason of an error reply: ApiError.to_response sets `error_code`."""
    return getattr(response, "error_code", None) or str(response.status_code)


class RequestContextMiddleware:
    """Async under ASGI (daphne: always in production). Under a sync handler (Django's sync
    test Client) it only sets a fresh id and the log context: the Redis collaborators belong to
    an event loop, and a sync handler would make one loop, hence one container, per request."""

    async_capable = True
    sync_capable = True

    def __init__(self, get_response):
        self.get_response = get_response
        self._is_async = iscoroutinefunction(self.get_response)
        if self._is_async:
            markcoroutinefunction(self)

    def __call__(self, request):
        if self._is_async:
            return self._acall(request)
        request_id = request_ids.new_request_id()
        request_ids.set_current_request_id(request_id)
        clear_request_context()
        bind_request_context(request_id=request_id)
        response = self.get_response(request)
        response[request_ids.HEADER] = request_id
        return response

    async def _acall(self, request):
        started = time.perf_counter()
        request_id = await begin_request(request.headers.get(request_ids.HEADER))
        response = await self.get_response(request)
        response[request_ids.HEADER] = request_id
        record_response(route_of(request), request.method, response,
                        time.perf_counter() - started)
        return response


async def begin_request(client_value: str | None) -> str:
    """The request's id (the client's X-Request-Id when well formed and not used before, else
    a fresh one), set for this task and bound to its log context. Also called by the API's
    direct ASGI path (inference/views/direct.py)."""
    if client_value:
        container = current_container()
        request_id, kept = await request_ids.claim(
            container.redis, container.key_prefix, client_value,
            settings.REQUEST_ID_CLAIM_SECONDS)
    else:
        request_id, kept = request_ids.new_request_id(), False
    # Not reset on return: a streamed body is sent after this returns, in the same task
    # (each HTTP request has its own task, so nothing leaks to the next request).
    request_ids.set_current_request_id(request_id)
    clear_request_context()
    bind_request_context(request_id=request_id)
    if client_value and not kept:
        logger.info("X-Request-Id not kept (malformed or already used); using a new id",
                    extra={"client_request_id": client_value[:200]})
    return request_id


def record_response(route: str, method: str, response, elapsed_s: float) -> None:
    """Count one HTTP reply (route pattern, method, status; time to its headers; an error's
    code as a refusal reason), written in the background: the reply does not wait."""
    method = method if method in METHODS else OTHER
    status = response.status_code
    batch = Batch()
    batch.inc(f.HTTP_REQUESTS, {"route": route, "method": method, "status": status})
    batch.observe(f.HTTP_DURATION, {"route": route, "method": method}, elapsed_s)
    if status >= 400:
        batch.inc(f.REFUSALS, {"route": route, "status": status,
                               "reason": error_code(response)})
    try:
        current_buffer().add(batch)
    except Exception:  # noqa: BLE001 - metrics are best effort
        logger.warning("HTTP metrics not recorded", exc_info=True)
