"""From a prepared (or replayed) request to a format's frames, for SSE and WebSocket alike.

`open_frames` primes the generation up to its first token before returning, so a request
that fails before any token (no replica, every replica failed, replica refused the input)
raises its ApiError and gets a proper HTTP status; after that, failures become the format's
error event. Closing the returned iterator closes the generation (which cancels the replica).

Tokens that arrive together leave together: after the first token the generation runs in a
task of its own (`_Pump`) that buffers what it yields, and the writer takes everything buffered
since its last write as one frame set: consecutive deltas become one delta event (one JSON
object), and a frame set is one write (one SSE chunk; the WebSocket sends its few events
back to back). Before each write the writer gives the loop a few turns (`GATHER_YIELDS`, no
waiting) while the pump keeps producing, since a token already received takes several turns
to come up from the gRPC stream: against the zero-cost fake replica, 64-token streams left in
~0.3 events per token instead of one each. The first token is written at once (TTFT).

`deadline` (the event loop's clock, from `request_deadline()`): past it the generation is
cancelled (releasing all it holds) and the client gets 504 deadline_exceeded, or the stream's
error event; a failing dependency mid-stream (Redis, PostgreSQL) is the error event too, so
every stream ends with a final event.
"""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import aclosing
from typing import AsyncIterator

import orjson

from inference.faults import as_api_error, deadline_exceeded
from inference.formats.base import Event, ResponseFormat, StreamMeta, replay_events
from inference.generation import Generation
from inference.first_token_priority import FirstTokenPriority
from inference.request import Delta, Done, PreparedRequest, Replayed, Result
from llm_platform.hot_settings import settings

logger = logging.getLogger(__name__)

Frames = list[Event]  # events written together
GATHER_YIELDS = 4


def request_deadline() -> float:
    """When a request starting now must have its final answer (event loop time)."""
    return asyncio.get_running_loop().time() + settings.REQUEST_DEADLINE_SECONDS


def meta_for(outcome: PreparedRequest | Replayed) -> StreamMeta:
    if isinstance(outcome, Replayed):
        result = outcome.result
        return StreamMeta(id=result["id"], created=result["created"], model=result["model"],
                          include_usage=outcome.request.include_usage)
    return StreamMeta(id=outcome.request_id, created=int(time.time()),
                      model=outcome.target.model_name, include_usage=outcome.request.include_usage)


async def _replay(frames: Frames) -> AsyncIterator[Frames]:
    yield frames


async def open_frames(generation: Generation, outcome: PreparedRequest | Replayed,
                      fmt: ResponseFormat, deadline: float | None = None,
                      first_tokens: FirstTokenPriority | None = None) -> AsyncIterator[Frames]:
    meta = meta_for(outcome)
    if isinstance(outcome, Replayed):
        return _replay(replay_events(fmt, meta, Result.from_dict(outcome.result)))
    deadline = request_deadline() if deadline is None else deadline
    items = generation.generate(outcome)
    try:
        async with asyncio.timeout_at(deadline):
            first = await anext(items)  # raises ApiError before any token
    except TimeoutError:
        await items.aclose()
        raise deadline_exceeded() from None
    return _relay(_Pump(items, first, deadline, first_tokens), fmt, meta)


class _Pump:
    """Runs the rest of a generation in its own task, buffering what it yields, so the writer
    can take everything produced since its last write at once.

    The request's deadline is one timer for the whole stream, armed by the first `take` (a
    relay never iterated holds nothing until then); it wakes `take`, which raises TimeoutError.
    Before, an `asyncio.timeout_at` around every write cost a Timeout, a TimerHandle and a heap
    push and cancel per frame set."""

    def __init__(self, items: AsyncIterator[Delta | Done], first: Delta | Done,
                 deadline: float, first_tokens: FirstTokenPriority | None = None):
        self._items = items
        self._first_tokens = first_tokens
        self._buffer: list[Delta | Done] = [first]
        self._ready = asyncio.Event()
        self._ready.set()
        self._error: BaseException | None = None
        self._task: asyncio.Task | None = None
        self._expired = False
        self._deadline_at = deadline
        self._deadline: asyncio.TimerHandle | None = None  # armed by the first take

    def _expire(self) -> None:
        self._expired = True
        self._ready.set()

    def _start(self) -> None:
        if self._task is None and not isinstance(self._buffer[-1], Done):
            self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            first_tokens = self._first_tokens
            async with aclosing(self._items) as items:
                # Before each read: requests before their first token go first.
                if first_tokens is not None and first_tokens.pending_count:
                    await first_tokens.quiet()
                async for item in items:
                    self._buffer.append(item)
                    self._ready.set()
                    if first_tokens is not None and first_tokens.pending_count:
                        await first_tokens.quiet()
        except Exception as exc:  # noqa: BLE001 - the writer turns it into the error event
            self._error = exc
        finally:
            self._ready.set()

    async def gather(self) -> None:
        """Let the generation catch up before a write: yield to the event loop while it keeps
        producing (at most GATHER_YIELDS times; one item needs a few loop turns to come up
        from the gRPC stream), so tokens already on their way join this write."""
        for _ in range(GATHER_YIELDS):
            if self._expired or self._task is None or self._task.done() or (
                    self._buffer and isinstance(self._buffer[-1], Done)):
                return
            await asyncio.sleep(0)  # one turn of the loop, not a wait

    def take_ready(self) -> list[Delta | Done]:
        """What is buffered now, possibly nothing."""
        taken, self._buffer = self._buffer, []
        return taken

    async def take(self) -> list[Delta | Done]:
        """Everything buffered since the last take (waits for at least one item); raises what
        the generation raised once its items are taken; TimeoutError past the deadline."""
        if self._deadline is None:
            self._deadline = asyncio.get_running_loop().call_at(self._deadline_at, self._expire)
        self._start()
        while not self._buffer:
            if self._expired:
                raise TimeoutError
            if self._error is not None:
                raise self._error
            if self._task is not None and self._task.done():
                raise RuntimeError("generation ended without a result")
            self._ready.clear()
            await self._ready.wait()
        taken, self._buffer = self._buffer, []
        return taken

    async def finished(self) -> None:
        """Wait for the generation's own end (its usage, Idempotency-Key and bucket
        bookkeeping run after its last item)."""
        if self._deadline is not None:
            self._deadline.cancel()
        if self._task is not None:
            await asyncio.wait([self._task])
        await self._items.aclose()  # the first item was the last: the task never ran

    async def cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        if self._task is not None:
            if not self._task.done():
                self._task.cancel()
            await asyncio.wait([self._task])  # its bookkeeping is shielded; it ends
        # A task cancelled before it ran never opened the generation: close it here (a
        # no-op for a generation that ended).
        await self._items.aclose()


def coalesce(fmt: ResponseFormat, meta: StreamMeta, items: list[Delta | Done]) -> tuple[Frames, Done | None]:
    """One frame set for items produced together: consecutive deltas as one delta event."""
    frames: Frames = []
    texts: list[str] = []
    done = None
    for item in items:
        if isinstance(item, Done):
            done = item
            break
        texts.append(item.text)
    if texts:
        frames.extend(fmt.delta(meta, "".join(texts)))
    if done is not None:
        frames.extend(fmt.finish(meta, done.result))
    return frames, done


async def _relay(pump: _Pump, fmt: ResponseFormat, meta: StreamMeta) -> AsyncIterator[Frames]:
    start = list(fmt.start(meta))
    finished = False
    first = True  # the first token is written at once (TTFT)
    try:
        while True:
            try:
                items = await pump.take()
                if not first and not isinstance(items[-1], Done):
                    await pump.gather()
                    items += pump.take_ready()
            except Exception as exc:  # noqa: BLE001 - every stream ends with a final event
                error = deadline_exceeded() if isinstance(exc, TimeoutError) else as_api_error(
                    exc, "stream")
                finished = True
                await pump.cancel()  # what the request holds is released before its last event
                yield start + fmt.error(meta, error.body())
                return
            first = False
            frames, done = coalesce(fmt, meta, items)
            if start:
                frames, start = start + frames, []
            if done is not None:
                yield frames
                await pump.finished()
                finished = True
                return
            if frames:
                yield frames
    finally:
        if not finished:
            await pump.cancel()


async def complete(generation: Generation, outcome: PreparedRequest | Replayed,
                   deadline: float | None = None) -> Result:
    """The whole reply of a non-streaming request (504 past `deadline`)."""
    if isinstance(outcome, Replayed):
        return Result.from_dict(outcome.result)
    deadline = request_deadline() if deadline is None else deadline
    try:
        async with asyncio.timeout_at(deadline):
            async with aclosing(generation.generate(outcome)) as items:
                async for item in items:
                    if isinstance(item, Done):
                        return item.result
    except TimeoutError:
        raise deadline_exceeded() from None
    raise RuntimeError("generation ended without a result")  # generate() always ends with Done


def encode_sse(fmt: ResponseFormat, frames: Frames) -> bytes:
    """One SSE chunk for a frame set."""
    parts = []
    for event in frames:
        if fmt.named_events:
            parts.append(b"event: " + event.name.encode() + b"\ndata: ")
        else:
            parts.append(b"data: ")
        parts.append(orjson.dumps(event.data))
        parts.append(b"\n\n")
    return b"".join(parts)


class LastChunk(bytes):
    """A stream's last chunk (`sse_bytes`'s `data: [DONE]`): the server may write the end of
    the body with it, one send instead of two (inference/views/direct.py)."""

    __slots__ = ()


async def sse_bytes(fmt: ResponseFormat, frames: AsyncIterator[Frames]) -> AsyncIterator[bytes]:
    async with aclosing(frames):
        async for frame_set in frames:
            yield encode_sse(fmt, frame_set)
    if fmt.done_sentinel is not None:  # after the generation's own end (usage, buckets)
        yield LastChunk(f"data: {fmt.done_sentinel}\n\n".encode("ascii"))
