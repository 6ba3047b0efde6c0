"""WebSocket /v1/stream: the /v1/generate body in, the same events as its SSE stream out.

Each text message is one request (`{"model", "messages", "max_tokens", ...}`, plus optional
`"idempotency_key"` and, for clients that cannot set headers, `"api_key"`). The server sends
JSON messages `{"type": "token", "text"}` ... `{"type": "done", "finish_reason", "usage"}`, or
`{"type": "error", "error": {...}, "status": <HTTP status>}`. One request at a time per socket;
closing the socket cancels the running request on the replica.

Failures: a refused request (4xx) gets its error frame and the socket stays open for the next
one; any server-side failure (5xx: Redis or PostgreSQL unavailable, every replica failing, the
deadline, an unexpected error) gets its error frame and then the server closes the socket
(code 1011). A socket that has not sent an authenticated request within
settings.WEBSOCKET_AUTH_TIMEOUT_SECONDS gets a 401 error frame and is closed (code 4401).
"""
from __future__ import annotations

import asyncio
import contextlib
from contextlib import aclosing

import orjson

from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings

from inference.container import current_container
from inference.endpoints import GENERATE
from inference.errors import ApiError, Conflict, InvalidRequest, Unauthorized
from inference.faults import as_api_error, preparing
from inference.pipeline import decode_body
from inference.relay import open_frames, request_deadline
from llm_platform.db_watchdog import query_timeout

# Close codes: the server failed (RFC 6455 1011); no authenticated request in time.
CLOSE_SERVER_ERROR = 1011
CLOSE_UNAUTHENTICATED = 4401


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class StreamConsumer(AsyncWebsocketConsumer):
    task: asyncio.Task | None = None
    # True from a request's arrival until its last event is sent; its task may run on a
    # moment longer (usage, idempotency bookkeeping), which the next request waits out.
    streaming: bool = False
    authenticated: bool = False  # some request on this socket carried a valid key
    idle_task: asyncio.Task | None = None

    async def connect(self):
        await self.accept()
        self.idle_task = asyncio.create_task(self._close_if_unauthenticated())

    async def _close_if_unauthenticated(self) -> None:
        await asyncio.sleep(settings.WEBSOCKET_AUTH_TIMEOUT_SECONDS)
        if not self.authenticated:
            await self._send_error(Unauthorized(
                f"No authenticated request within {settings.WEBSOCKET_AUTH_TIMEOUT_SECONDS:g} s;"
                " closing.", code="authentication_timeout"))
            await self.close(code=CLOSE_UNAUTHENTICATED)

    async def receive(self, text_data=None, bytes_data=None):
        if self.streaming:
            await self._send_error(Conflict("A request is already running on this socket.",
                                            code="request_in_progress"))
            return
        if self.task is not None:
            await asyncio.wait([self.task])
        self.streaming = True
        raw = text_data.encode("utf-8") if text_data is not None else (bytes_data or b"")
        self.task = asyncio.create_task(self._run(raw))

    async def disconnect(self, code):
        if self.idle_task is not None:
            self.idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.idle_task
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait([self.task])  # let the generation record usage and release

    async def _send_error(self, exc: ApiError) -> None:
        payload = {"type": "error", **exc.body(), "status": exc.status}
        if "Retry-After" in exc.headers:
            payload["retry_after"] = int(exc.headers["Retry-After"])
        await self.send(orjson.dumps(payload).decode())

    async def _run(self, raw: bytes) -> None:
        with query_timeout(settings.DB_QUERY_TIMEOUT_SECONDS):  # no read timeout of its own
            await self._serve(raw)

    async def _serve(self, raw: bytes) -> None:
        try:
            body = decode_body(raw)
            if not isinstance(body, dict):
                raise InvalidRequest("The message must be a JSON object.")
            api_key = body.pop("api_key", None)
            idempotency_key = body.pop("idempotency_key", None)
            conversation_id = body.pop("conversation_id", None)
            for name, value in (("idempotency_key", idempotency_key),
                                ("conversation_id", conversation_id)):
                if value is not None and not isinstance(value, str):
                    raise InvalidRequest(f"{name} must be a string.", param=name)
            authorization = _header(self.scope, b"authorization")
            if authorization is None and isinstance(api_key, str):
                authorization = f"Bearer {api_key}"
            container = current_container()
            deadline = request_deadline()
            first_tokens = container.first_tokens  # as the HTTP routes
            with first_tokens.pending():
                async with preparing(deadline):  # 503 in seconds if PostgreSQL or Redis hangs
                    principal = await container.preparation.authenticate(authorization)
                    self.authenticated = True
                    # One key-rate count with the HTTP routes.
                    outcome = await container.preparation.prepare_for_key(
                        GENERATE, principal, body,
                        idempotency_key if isinstance(idempotency_key, str) else None,
                        conversation_id if isinstance(conversation_id, str) else None)
                frames = await open_frames(container.generation, outcome,
                                           GENERATE.response_format, deadline, first_tokens)
            failed = False
            async with aclosing(frames):
                async for frame_set in frames:  # tokens that arrived together: one message
                    for event in frame_set:
                        payload = {"type": event.name, **event.data}
                        if event.name == "error":
                            failed = True
                            code = event.data.get("error", {}).get("code")
                            payload["status"] = 504 if code == "deadline_exceeded" else 503
                        if event.name in {"done", "error"}:
                            self.streaming = False
                        await self.send(orjson.dumps(payload).decode())
            if failed:
                await self.close(code=CLOSE_SERVER_ERROR)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure gets its error frame
            self.streaming = False
            error = as_api_error(exc, "websocket")
            with contextlib.suppress(Exception):
                await self._send_error(error)
                if error.status >= 500:
                    await self.close(code=CLOSE_SERVER_ERROR)
        finally:
            self.streaming = False
