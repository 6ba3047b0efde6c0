"""FirstTokenPriority (inference/first_token_priority.py): while a request waits for its first
token, streams that already have one hold their tokens (at most defer_s), then send them as
one frame set. Pure logic: the relay is driven by stand-in generations; "waits" is counted in
loop turns and events, not time."""
from __future__ import annotations

import asyncio

import pytest

from inference.endpoints import GENERATE
from inference.first_token_priority import FirstTokenPriority
from inference.relay import GATHER_YIELDS, open_frames, sse_bytes
from inference.request import Delta, Done
from tests.platform.test_relay_frames import FAR, _prepared, _result
from tests.support.platform import sse_events

TEXTS = [f"t{i} " for i in range(8)]


async def _turns(count: int = 200) -> None:
    for _ in range(count):
        await asyncio.sleep(0)  # a loop turn, not a wait


class Pushed:
    """A generation fed as a replica's call is: tokens arrive on their own (further apart
    than the writer's gathering turns, so each would leave in a write of its own) into an
    inbox, and the generation yields what the inbox holds."""

    def __init__(self):
        self.inbox: list = []
        self.arrived = asyncio.Event()
        self.feeder: asyncio.Task | None = None

    async def _feed(self) -> None:
        for text in TEXTS[1:]:
            for _ in range(GATHER_YIELDS + 3):
                await asyncio.sleep(0)
            self.inbox.append(Delta(text))
            self.arrived.set()
        self.inbox.append(Done(_result(TEXTS)))
        self.arrived.set()

    async def generate(self, prepared):
        self.feeder = asyncio.create_task(self._feed())
        yield Delta(TEXTS[0])
        while True:
            while not self.inbox:
                self.arrived.clear()
                await self.arrived.wait()
            item = self.inbox.pop(0)
            yield item
            if isinstance(item, Done):
                return


async def _stream(priority: FirstTokenPriority, writes: list[bytes]) -> None:
    fmt = GENERATE.response_format
    frames = await open_frames(Pushed(), _prepared(), fmt, FAR, priority)
    async for chunk in sse_bytes(fmt, frames):
        writes.append(chunk)


def _text(writes: list[bytes]) -> str:
    return "".join(data["text"] for chunk in writes for name, data in sse_events(chunk)
                   if name == "token")


@pytest.mark.asyncio
async def test_with_nobody_waiting_tokens_leave_as_they_come():
    writes: list[bytes] = []
    await _stream(FirstTokenPriority(defer_s=60), writes)
    assert _text(writes) == "".join(TEXTS)
    assert len(writes) >= len(TEXTS)  # one write per token (and the end)


@pytest.mark.asyncio
async def test_a_stream_holds_its_tokens_while_a_request_waits_then_sends_them_together():
    priority = FirstTokenPriority(defer_s=60)
    writes: list[bytes] = []
    with priority.pending():  # another request, before its first token
        stream = asyncio.create_task(_stream(priority, writes))
        await _turns()
        assert _text(writes) == TEXTS[0]  # the first token went at once; the rest waits
        assert not stream.done()
    await asyncio.wait_for(stream, 30)
    assert _text(writes) == "".join(TEXTS)
    assert len(writes) <= 3  # the first token, then what gathered (and the end)


@pytest.mark.asyncio
async def test_a_stream_waits_defer_s_at_the_most():
    priority = FirstTokenPriority(defer_s=0.01)
    writes: list[bytes] = []
    with priority.pending():  # never ends while the stream runs
        await asyncio.wait_for(_stream(priority, writes), 30)
    assert _text(writes) == "".join(TEXTS)


@pytest.mark.asyncio
async def test_quiet_returns_once_every_pending_request_has_its_first_token():
    priority = FirstTokenPriority(defer_s=60)
    await asyncio.wait_for(priority.quiet(), 1)  # nobody pending: at once
    with priority.pending():
        with priority.pending():
            quiet = asyncio.create_task(priority.quiet())
            await _turns(20)
            assert not quiet.done()
        await _turns(20)
        assert not quiet.done()  # one request still waits
    await asyncio.wait_for(quiet, 1)
    assert priority.pending_count == 0


@pytest.mark.asyncio
async def test_defer_zero_turns_it_off():
    priority = FirstTokenPriority(defer_s=0)
    with priority.pending():
        await asyncio.wait_for(priority.quiet(), 1)
