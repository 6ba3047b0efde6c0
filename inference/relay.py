"""From a prepared (or replayed) request to a format's events, for SSE and WebSocket alike.

`open_events` primes the generation up to its first token before returning, so a request
that fails before any token (no replica, every replica failed, replica refused the input)
raises its ApiError and gets a proper HTTP status; after that, failures become the format's
error event. Closing the returned iterator closes the generation (which cancels the replica).

`deadline` (the event loop's clock, from `request_deadline()`): past it the generation is
cancelled (releasing all it holds) and the client gets 504 deadline_exceeded, or the stream's
error event; a failing dependency mid-stream (Redis, PostgreSQL) is the error event too, so
every stream ends with a final event.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import aclosing
from typing import AsyncIterator

from django.conf import settings

from inference.container import Container
from inference.errors import ApiError
from inference.faults import as_api_error, deadline_exceeded
from inference.formats.base import Event, ResponseFormat, StreamMeta, replay_events
from inference.generation import Delta, Done, Result, generate
from inference.pipeline import Prepared, Replayed


logger = logging.getLogger(__name__)


def request_deadline() -> float:
    """When a request starting now must have its final answer (event loop time)."""
    return asyncio.get_running_loop().time() + settings.REQUEST_DEADLINE_SECONDS


def meta_for(outcome: Prepared | Replayed) -> StreamMeta:
    if isinstance(outcome, Replayed):
        result = outcome.result
        return StreamMeta(id=result["id"], created=result["created"], model=result["model"],
                          include_usage=outcome.request.include_usage)
    return StreamMeta(id=outcome.request_id, created=int(time.time()),
                      model=outcome.target.model_name, include_usage=outcome.request.include_usage)


async def _iterate(events: list[Event]) -> AsyncIterator[Event]:
    for event in events:
        yield event


async def open_events(container: Container, outcome: Prepared | Replayed,
                      fmt: ResponseFormat, deadline: float | None = None) -> AsyncIterator[Event]:
    meta = meta_for(outcome)
    if isinstance(outcome, Replayed):
        return _iterate(replay_events(fmt, meta, Result.from_dict(outcome.result)))
    deadline = request_deadline() if deadline is None else deadline
    generation = generate(container, outcome)
    try:
        async with asyncio.timeout_at(deadline):
            first = await anext(generation)  # raises ApiError before any token
    except TimeoutError:
        raise deadline_exceeded() from None
    return _relay(generation, first, fmt, meta, deadline)


async def _relay(generation, first: Delta | Done, fmt: ResponseFormat,
                 meta: StreamMeta, deadline: float) -> AsyncIterator[Event]:
    async with aclosing(generation):
        for event in fmt.start(meta):
            yield event
        item = first
        try:
            while True:
                if isinstance(item, Done):
                    for event in fmt.finish(meta, item.result):
                        yield event
                    return
                for event in fmt.delta(meta, item.text):
                    yield event
                async with asyncio.timeout_at(deadline):
                    item = await anext(generation)
        except Exception as exc:  # noqa: BLE001 - every stream ends with a final event
            error = deadline_exceeded() if isinstance(exc, TimeoutError) else as_api_error(
                exc, "stream")
            for event in fmt.error(meta, error.body()):
                yield event


async def complete(container: Container, outcome: Prepared | Replayed,
                   deadline: float | None = None) -> Result:
    """The whole reply of a non-streaming request (504 past `deadline`)."""
    if isinstance(outcome, Replayed):
        return Result.from_dict(outcome.result)
    deadline = request_deadline() if deadline is None else deadline
    try:
        async with asyncio.timeout_at(deadline):
            async with aclosing(generate(container, outcome)) as generation:
                async for item in generation:
                    if isinstance(item, Done):
                        return item.result
    except TimeoutError:
        raise deadline_exceeded() from None
    raise RuntimeError("generation ended without a result")  # generate() always ends with Done


def encode_sse(fmt: ResponseFormat, event: Event) -> bytes:
    data = json.dumps(event.data, separators=(",", ":"), ensure_ascii=False)
    if fmt.named_events:
        return f"event: {event.name}\ndata: {data}\n\n".encode("utf-8")
    return f"data: {data}\n\n".encode("utf-8")


async def sse_bytes(fmt: ResponseFormat, events: AsyncIterator[Event]) -> AsyncIterator[bytes]:
    async with aclosing(events):
        async for event in events:
            yield encode_sse(fmt, event)
    if fmt.done_sentinel is not None:
        yield f"data: {fmt.done_sentinel}\n\n".encode("ascii")
