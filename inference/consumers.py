"""WebSocket /v1/stream: the /v1/generate body in, the same events as its SSE stream out.

Each text message is one request (`{"model", "messages", "max_tokens", ...}`, plus optional
`"idempotency_key"` and, for clients that cannot set headers, `"api_key"`). The server sends
JSON messages `{"type": "token", "text"}` ... `{"type": "done", "finish_reason", "usage"}`, or
`{"type": "error", "error": {...}, "status": <HTTP status>}`. One request at a time per socket;
closing the socket cancels the running request on the replica.
"""
from __future__ import annotations

import asyncio
import json
from contextlib import aclosing

from channels.generic.websocket import AsyncWebsocketConsumer

from inference.container import current_container
from inference.errors import ApiError, Conflict, InvalidRequest
from inference.formats.native import NativeFormat
from inference.pipeline import decode_body, prepare
from inference.relay import open_events


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

    async def connect(self):
        await self.accept()

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
        if self.task is not None and not self.task.done():
            self.task.cancel()
            await asyncio.wait([self.task])  # let the generation record usage and release

    async def _send_error(self, exc: ApiError) -> None:
        payload = {"type": "error", **exc.body(), "status": exc.status}
        if "Retry-After" in exc.headers:
            payload["retry_after"] = int(exc.headers["Retry-After"])
        await self.send(json.dumps(payload))

    async def _run(self, raw: bytes) -> None:
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
            outcome = await prepare(container, "generate", authorization, body,
                                    idempotency_key if isinstance(idempotency_key, str) else None,
                                    conversation_id if isinstance(conversation_id, str) else None)
            fmt = NativeFormat()
            events = await open_events(container, outcome, fmt)
            async with aclosing(events):
                async for event in events:
                    payload = {"type": event.name, **event.data}
                    if event.name == "error":
                        payload["status"] = 503
                    if event.name in {"done", "error"}:
                        self.streaming = False
                    await self.send(json.dumps(payload, ensure_ascii=False))
        except ApiError as exc:
            self.streaming = False
            await self._send_error(exc)
        finally:
            self.streaming = False
