"""The relay's frame sets (inference/relay.py): tokens that arrive together leave together.

Pure logic: the relay is driven by a stand-in generation whose items the test releases in
groups (`Source`), so "arrived together" is exact, not a matter of timing. The e2e side (the
content through daphne and a replica is unchanged) is covered by test_api_generate and the
streaming e2e tests.
"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from inference.endpoints import CHAT, GENERATE
from inference.errors import ReplicaFailed
from inference.relay import open_frames, sse_bytes
from inference.request import Delta, Done, PreparedRequest, Result
from tests.support.platform import sse_events

FAR = 10**9  # a deadline (event loop time) no test reaches


def _prepared() -> PreparedRequest:
    return PreparedRequest(request_id="r1", principal=None,
                           target=SimpleNamespace(model_name="chat-small"),
                           request=SimpleNamespace(include_usage=False), prompt_text="",
                           prompt_token_ids=(), max_tokens=8, claim=None, charge=None)


def _result(texts: list[str]) -> Result:
    return Result(id="r1", created=0, model="chat-small", deltas=texts, finish_reason="stop",
                  input_tokens=3, output_tokens=len(texts))


class Source:
    """A generation whose items come in groups: `release()` lets the next group out, all of
    it without suspending in between (what a replica's burst looks like to the relay)."""

    def __init__(self, groups: list[list], fail_after: bool = False):
        self.groups = groups
        self.fail_after = fail_after
        self.gates = [asyncio.Event() for _ in groups]
        self.gates[0].set()
        self.finished = False  # the generation's own cleanup ran
        self.cancelled = False

    def release(self, index: int) -> None:
        self.gates[index].set()

    async def generate(self, prepared):
        try:
            for gate, group in zip(self.gates, self.groups):
                await gate.wait()
                for item in group:
                    yield item
            if self.fail_after:
                raise ReplicaFailed("The replica failed mid-stream: gone")
        except (asyncio.CancelledError, GeneratorExit):
            self.cancelled = True
            raise
        finally:
            self.finished = True


async def _writes(source: Source, fmt, release_after_first: bool = True) -> list[bytes]:
    """The SSE writes (one bytes object each) of the stream, releasing every later group once
    the first write is out."""
    frames = await open_frames(source, _prepared(), fmt, FAR)
    writes = []
    async for chunk in sse_bytes(fmt, frames):
        writes.append(chunk)
        if release_after_first and len(writes) == 1:
            for index in range(1, len(source.gates)):
                source.release(index)
    return writes


@pytest.mark.asyncio
async def test_tokens_that_arrive_together_leave_in_one_write():
    texts = ["Once", " upon", " a", " time"]
    source = Source([[Delta("Once")],
                     [Delta(" upon"), Delta(" a"), Delta(" time"), Done(_result(texts))]])
    writes = await _writes(source, GENERATE.response_format)
    assert len(writes) == 2  # the first token alone (TTFT), then the burst and the end
    assert sse_events(writes[0]) == [("token", {"text": "Once"})]
    burst = sse_events(writes[1])
    assert burst[0] == ("token", {"text": " upon a time"})  # three deltas, one event
    assert burst[1][0] == "done" and burst[1][1]["usage"]["output_tokens"] == 4
    assert len(burst) == 2
    assert source.finished and not source.cancelled  # its bookkeeping ran before the end


@pytest.mark.asyncio
async def test_coalesced_stream_keeps_the_content_and_openai_shape():
    texts = ["a", "b", "c", "d", "e"]
    source = Source([[Delta("a")], [Delta("b"), Delta("c")], [Delta("d"), Delta("e")],
                     [Done(_result(texts))]])
    frames = await open_frames(source, _prepared(), CHAT.response_format, FAR)
    writes = []
    async for chunk in sse_bytes(CHAT.response_format, frames):
        writes.append(chunk)
        if len(writes) < len(source.gates):
            source.release(len(writes))  # one group per write: nothing to gather
    events = [data for chunk in writes for _, data in sse_events(chunk)]
    assert events[-1] == "[DONE]"
    content = "".join(e["choices"][0]["delta"].get("content") or "" for e in events[:-1]
                      if e["choices"])
    assert content == "abcde"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    # role chunk + "a" in the first write, then "bc", "de", the final chunk, [DONE]
    assert len(writes) == 5


@pytest.mark.asyncio
async def test_failure_mid_stream_is_the_last_event_after_what_was_streamed():
    source = Source([[Delta("x")], [Delta("y"), Delta("z")]], fail_after=True)
    writes = await _writes(source, GENERATE.response_format)
    events = [event for chunk in writes for event in sse_events(chunk)]
    assert events[0] == ("token", {"text": "x"})
    assert events[1] == ("token", {"text": "yz"})
    assert events[2][0] == "error" and events[2][1]["error"]["code"] == "replica_error"
    assert source.finished


@pytest.mark.asyncio
async def test_closing_the_stream_cancels_the_generation():
    source = Source([[Delta("x")], [Delta("never")]])
    frames = await open_frames(source, _prepared(), GENERATE.response_format, FAR)
    assert [e.name for e in await anext(frames)] == ["token"]
    await frames.aclose()  # what the response does when its client goes away
    assert source.cancelled and source.finished


@pytest.mark.asyncio
async def test_past_the_deadline_the_stream_ends_with_its_error_event():
    source = Source([[Delta("x")], [Delta("late")]])
    loop = asyncio.get_running_loop()
    frames = await open_frames(source, _prepared(), GENERATE.response_format,
                               loop.time() + 0.05)
    names = [event.name for frame_set in [f async for f in frames] for event in frame_set]
    assert names == ["token", "error"]
    assert source.cancelled and source.finished


@pytest.mark.asyncio
async def test_tokens_a_loop_turn_apart_join_one_write():
    """A token already received takes a few loop turns to come up from the gRPC stream: the
    writer gives the loop those turns before writing, so such tokens still leave together."""
    texts = ["a", "b", "c", "d"]

    class Trickle:
        async def generate(self, prepared):
            yield Delta("a")
            for text in texts[1:]:
                await asyncio.sleep(0)  # the next token is one loop turn away
                yield Delta(text)
            yield Done(_result(texts))

    frames = await open_frames(Trickle(), _prepared(), GENERATE.response_format, FAR)
    writes = [chunk async for chunk in sse_bytes(GENERATE.response_format, frames)]
    events = [event for chunk in writes for event in sse_events(chunk)]
    assert "".join(data["text"] for name, data in events if name == "token") == "abcd"
    assert len(writes) == 2  # "a" at once; "bcd" and the end together
    assert sse_events(writes[1])[0] == ("token", {"text": "bcd"})
