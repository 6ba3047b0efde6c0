"""/v1/generate (and /v1/stream): token events, then one `done` event with usage."""
from __future__ import annotations

from inference.formats.base import Event, StreamMeta
from inference.request import Result


def _usage(result: Result) -> dict:
    return {"input_tokens": result.input_tokens, "output_tokens": result.output_tokens}


class NativeFormat:
    named_events = True
    done_sentinel = None

    def start(self, meta: StreamMeta) -> list[Event]:
        return []

    def delta(self, meta: StreamMeta, text: str) -> list[Event]:
        return [Event("token", {"text": text})]

    def finish(self, meta: StreamMeta, result: Result) -> list[Event]:
        return [Event("done", {"id": result.id, "model": result.model,
                               "finish_reason": result.finish_reason, "usage": _usage(result)})]

    def error(self, meta: StreamMeta, error_body: dict) -> list[Event]:
        return [Event("error", error_body)]

    def complete(self, result: Result) -> dict:
        return {
            "id": result.id,
            "object": "generation",
            "created": result.created,
            "model": result.model,
            "text": result.text,
            "finish_reason": result.finish_reason,
            "usage": _usage(result),
        }
