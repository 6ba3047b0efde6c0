"""POST /v1/generate, /v1/chat/completions, /v1/completions: thin async views."""
from __future__ import annotations

from django.conf import settings
from django.http import JsonResponse, StreamingHttpResponse

from inference.container import current_container
from inference.errors import ApiError, PayloadTooLarge
from inference.formats import FORMATS
from inference.pipeline import decode_body, prepare, quota_headers_for
from inference.faults import preparing
from inference.relay import complete, open_events, request_deadline, sse_bytes
from inference.views.errors import api_endpoint

QUOTA_HEADER = "x-ratelimit-limit-requests"
# Refusals because PostgreSQL or Redis hung: looking up the quota headers would hang as well.
DEPENDENCY_FAILURES = frozenset({"dependency_timeout", "deadline_exceeded"})


def _content_length(request) -> int:
    try:
        return int(request.headers.get("Content-Length") or 0)
    except ValueError:
        return 0


async def _serve(request, endpoint: str):
    # Every reply to an authenticated request carries the x-ratelimit-* headers: the
    # admission's (200 JSON or SSE, and the 503s after it), the check's (429), else the
    # buckets as they are (a replay; a refusal before the check: 400, 404, 409, 413, 422).
    container = current_container()
    authorization = request.headers.get("Authorization")
    deadline = request_deadline()  # the final answer comes by then (REQUEST_DEADLINE_SECONDS)
    try:
        if _content_length(request) > settings.API_MAX_BODY_BYTES:
            raise PayloadTooLarge(f"The request body exceeds {settings.API_MAX_BODY_BYTES} bytes.")
        async with preparing(deadline):  # 503 in seconds if PostgreSQL or Redis hangs
            outcome = await prepare(container, endpoint, authorization,
                                    decode_body(request.body),
                                    request.headers.get("Idempotency-Key"),
                                    request.headers.get("X-Conversation-Id"))
    except ApiError as exc:
        if QUOTA_HEADER not in exc.headers and exc.code not in DEPENDENCY_FAILURES:
            exc.headers = {**await quota_headers_for(container, authorization), **exc.headers}
        raise
    quota_headers = outcome.quota_headers
    try:
        response = await _reply(container, outcome, FORMATS[endpoint](), deadline)
    except ApiError as exc:
        exc.headers = {**quota_headers, **exc.headers}
        raise
    for name, value in quota_headers.items():
        response[name] = value
    return response


async def _reply(container, outcome, fmt, deadline: float):
    if not outcome.request.stream:
        result = await complete(container, outcome, deadline)
        return JsonResponse(fmt.complete(result))
    events = await open_events(container, outcome, fmt, deadline)
    response = StreamingHttpResponse(sse_bytes(fmt, events), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


@api_endpoint("POST")
async def generate_view(request):
    return await _serve(request, "generate")


@api_endpoint("POST")
async def chat_completions_view(request):
    return await _serve(request, "chat")


@api_endpoint("POST")
async def completions_view(request):
    return await _serve(request, "completions")
