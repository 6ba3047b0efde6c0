"""A response format turns the generation's events into one endpoint's wire shape.

Streams are sequences of `Event(name, data)`: SSE writes `event: name` (when the format
names its events) and `data: <json>`; the WebSocket writes `{"type": name, **data}`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from inference.request import Result


@dataclass(frozen=True)
class Event:
    name: str
    data: dict


@dataclass(frozen=True)
class StreamMeta:
    id: str
    created: int
    model: str
    include_usage: bool


class ResponseFormat(Protocol):
    named_events: bool  # SSE `event:` lines (native) or data-only (OpenAI)
    done_sentinel: str | None  # OpenAI's final `data: [DONE]`

    def start(self, meta: StreamMeta) -> list[Event]: ...

    def delta(self, meta: StreamMeta, text: str) -> list[Event]: ...

    def finish(self, meta: StreamMeta, result: Result) -> list[Event]: ...

    def error(self, meta: StreamMeta, error_body: dict) -> list[Event]: ...

    def complete(self, result: Result) -> dict: ...


def replay_events(fmt: ResponseFormat, meta: StreamMeta, result: Result) -> list[Event]:
    """The same stream a live request produced, from a stored Result."""
    events = list(fmt.start(meta))
    for text in result.deltas:
        events.extend(fmt.delta(meta, text))
    events.extend(fmt.finish(meta, result))
    return events
