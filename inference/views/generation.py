"""POST /v1/generate, /v1/chat/completions, /v1/completions: thin async views.

view -> `Preparation.prepare` (auth, parse, quota, idempotency) -> `Generation` through the
relay (admit, route and stream, finish) -> JSON or SSE. The endpoint kind
(inference/endpoints.py) carries what differs between the three.
"""
from __future__ import annotations

import orjson
from django.http import HttpResponse, StreamingHttpResponse

from inference.container import current_container
from inference.endpoints import CHAT, COMPLETIONS, GENERATE, EndpointKind
from inference.errors import ApiError
from inference.faults import preparing
from inference.pipeline import Submission
from inference.relay import complete, open_frames, request_deadline, sse_bytes
from inference.views.errors import api_endpoint


def _content_length(request) -> int:
    try:
        return int(request.headers.get("Content-Length") or 0)
    except ValueError:
        return 0


async def _serve(request, kind: EndpointKind):
    # Every reply to an authenticated request carries the x-ratelimit-* headers: the
    # admission's (200 JSON or SSE, and the 503s after it), the check's (429), else the
    # buckets as they are (a replay; a refusal before the check: 400, 404, 409, 413, 422,
    # added by `prepare`, which authenticated the key).
    container = current_container()
    headers = request.headers
    submission = Submission(authorization=headers.get("Authorization"),
                            idempotency_key=headers.get("Idempotency-Key"),
                            conversation_id=headers.get("X-Conversation-Id"),
                            declared_length=_content_length(request),
                            read_body=lambda: request.body)
    deadline = request_deadline()  # the final answer comes by then (REQUEST_DEADLINE_SECONDS)
    first_tokens = container.first_tokens
    lean = getattr(request, "lean_replies", False)  # the direct path: LeanReply
    # Until its first token (a stream) or its reply, the request goes before streams' relays
    # (inference/first_token_priority.py).
    with first_tokens.pending():
        async with preparing(deadline):  # 503 in seconds if PostgreSQL or Redis hangs
            outcome = await container.preparation.prepare(kind, submission)
        quota_headers = outcome.quota_headers
        try:
            response = await _reply(container.generation, outcome, kind, deadline, first_tokens,
                                    lean)
        except ApiError as exc:
            exc.headers = {**quota_headers, **exc.headers}
            raise
    for name, value in quota_headers.items():
        response[name] = value
    return response


async def _reply(generation, outcome, kind: EndpointKind, deadline: float, first_tokens,
                 lean: bool = False):
    fmt = kind.response_format
    if not outcome.request.stream:
        result = await complete(generation, outcome, deadline)
        body = orjson.dumps(fmt.complete(result))
        if lean:
            return LeanReply("application/json", content=body)
        return HttpResponse(body, content_type="application/json")
    frames = await open_frames(generation, outcome, fmt, deadline, first_tokens)
    if lean:
        response = LeanReply("text/event-stream", chunks=sse_bytes(fmt, frames))
    else:
        response = SseResponse(sse_bytes(fmt, frames))
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


class LeanReply:
    """A generation reply for the direct path (inference/views/direct.py), with what that path
    reads of a Django response: the status, the headers as set (in order, the names as
    written, looked up in any case), and the body or the SSE chunks. Building Django's
    response (its header map with charset checks, cookies) and reading its headers back cost
    about as much as the first token's frame, on that token's way out; Django's own handler
    still gets Django responses (`_reply` without `lean`). Header values are the platform's own
    (numbers, fixed words), never a client's."""

    __slots__ = ("content", "chunks", "streaming", "_headers")
    status_code = 200

    def __init__(self, content_type: str, *, content: bytes = b"", chunks=None):
        self.content = content
        self.chunks = chunks
        self.streaming = chunks is not None
        self._headers = {"content-type": ("Content-Type", content_type)}

    def __setitem__(self, name: str, value: str) -> None:
        self._headers[name.lower()] = (name, value)

    def has_header(self, name: str) -> bool:
        return name.lower() in self._headers

    def items(self):
        return self._headers.values()


class SseResponse(StreamingHttpResponse):
    """An SSE stream whose chunks the direct ASGI path (inference/views/direct.py) sends as
    they come (`chunks`: bytes already), past Django's two wrapping generators per chunk."""

    def __init__(self, chunks):
        super().__init__(chunks, content_type="text/event-stream")
        self.chunks = chunks


@api_endpoint("POST")
async def generate_view(request):
    return await _serve(request, GENERATE)


@api_endpoint("POST")
async def chat_completions_view(request):
    return await _serve(request, CHAT)


@api_endpoint("POST")
async def completions_view(request):
    return await _serve(request, COMPLETIONS)
