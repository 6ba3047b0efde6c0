"""Long-lived `ModelStreamInfer` calls shared by many requests, told apart by request id.

Triton's streaming call carries any number of requests: each response names its request
(`infer_response.id`, error responses included), and a request ends with its final response.
A gRPC call per request cost the API process ~0.4-0.5 ms of CPU before its first token
(grpc.aio's call setup, the request iterator's task, the call's status: benchmarks/README.md,
"frontdoor7"); here a request is one `write` on a call already open and its responses.

- `CallPool` (one per replica address and event loop) keeps up to `size` calls open and gives a
  request the one with the fewest requests in flight, opening another while every open call is
  busy. Without channels, one call alone reads every response of the replica in turn (a
  single shared call measured ~35 us more per streamed token than a call per request, 16 calls
  ~10 % less); with channels one call is the cheapest, since a replica flush is then one
  response for all its requests and a burst's submissions go out in fewer writes: the default
  (TRITON_CALLS_PER_REPLICA: llm_platform/settings.py says why).
- `SharedCall`: one reader task hands each response to its request's `Inbox`; writes go out in
  order from one writer task at a time (grpc.aio allows one write in flight per call).
- A call that fails (the connection lost, the replica gone, its access token refused) fails
  every request on it with the error, as a call per request would have, and leaves the pool;
  the next request opens a new one.
- Calls idle for `idle_s` are closed (`done_writing`: the replica ends the call as it would a
  call per request), so a replica that drains and stops holds no call of ours open: Triton
  2.51 does not unload its model while a call is open, so a replica stopped under an idle call
  was killed after its unload timeout (15 s), where with the call half-closed it stops in ~3 s
  (measured with the real replica; tests/replica/test_replica_access.py).

Channels (replica/backend/channel.py): a call opens one per model on its first request for
it (a control request the replica acknowledges); once acknowledged, the call's requests name it
and their outputs come back batched, one response per replica flush for every request on the
call, which the reader hands out entry by entry (`ChannelSupport.entries`). Until then, and for
good with a replica that refuses channels (an older one), requests stream on their own
responses. The call closes its channels before it half-closes (else the replica's channel
requests would keep it open).

Submission batches (replica/backend/submission_batch.py): a replica whose acknowledgement says
`"batches": true` takes several requests for the channel in one message. The writer sends what
gathered in the outbox while its last write was in flight: consecutive requests for one such
channel go as one batch (up to MAX_BATCH), everything else as it is, in order. grpc.aio takes
one write at a time per call, and a write's completion reaches the event loop only on one of
its turns, so a request of a burst of 32 on two calls waited 9.6-11.9 ms (median, 2 vCPUs) for
its write; the replica, for its part, takes one Triton request instead of one each. A batched
request has no response of its own: the replica sends its error as an entry on the channel; a
batch the replica refuses as a whole (its error reply names the batch) fails each of its
requests with that error.

Cancelling one request is the caller's business (the abort control request, sent on the same
call: see TritonReplicaClient.stream); cancelling the call would cancel every request on it.
"""
from __future__ import annotations

import asyncio
import logging
import itertools
import os
import secrets
from typing import Callable, Protocol

import grpc

from inference.replica_client import ReplicaStreamError, ReplicaUnavailable

logger = logging.getLogger(__name__)


class Inbox:
    """One request's responses as the reader hands them over, and the call's error if it ends
    first. `wait` is a future only while the request waits for the next response."""

    __slots__ = ("responses", "wait", "error")

    def __init__(self):
        self.responses: list = []
        self.wait: asyncio.Future | None = None
        self.error: BaseException | None = None

    async def arrival(self) -> None:
        """Until the reader hands over a response or the call's end."""
        self.wait = asyncio.get_running_loop().create_future()
        try:
            await self.wait
        finally:
            self.wait = None

    def _wake(self) -> None:
        wait = self.wait
        if wait is not None and not wait.done():
            wait.set_result(None)


class ChannelSupport(Protocol):
    """How a call speaks the replica's channel protocol (inference/triton_messages.py)."""

    def command(self, model_name: str, channel_id: str, open_: bool): ...

    def is_ack(self, response) -> bool: ...

    def takes_batches(self, response) -> bool: ...

    def entries(self, response) -> list[tuple[str, object]]: ...

    def batch(self, model_name: str, batch_id: str, submissions: list["Submission"]): ...


class Submission:
    """A generation request waiting in a call's outbox: sent as its own message (`message()`),
    or, with others for the same channel, as one entry of a submission batch
    (`ChannelSupport.batch` reads `payload`)."""

    __slots__ = ("request_id", "model_name", "channel", "payload", "_build")

    def __init__(self, request_id: str, model_name: str, channel: str | None, payload,
                 build: Callable[[object, str | None], object]):
        self.request_id = request_id
        self.model_name = model_name
        self.channel = channel  # the channel it names (None: it streams on its own responses)
        self.payload = payload
        self._build = build

    def message(self):
        return self._build(self.payload, self.channel)


# At most this many requests in one submission batch (the replica takes up to 256).
MAX_BATCH = 64


_CHANNEL_IDS = itertools.count()
_BATCH_IDS = itertools.count()
# Unique across the API processes of every host a replica serves (a pid alone repeats).
_CHANNEL_PREFIX = f"channel-{os.getpid()}-{secrets.token_hex(6)}"
_BATCH_PREFIX = f"batch-{_CHANNEL_PREFIX.removeprefix('channel-')}"
OPENING, OPEN, REFUSED = "opening", "open", "refused"


class SharedCall:
    def __init__(self, open_call: Callable[[], grpc.aio.StreamStreamCall],
                 on_end: Callable[["SharedCall"], None], channels: ChannelSupport | None = None):
        self._loop = asyncio.get_running_loop()
        self._call = open_call()
        self._on_end = on_end
        self._channels = channels
        self._channel_of: dict[str, list] = {}  # model -> [channel id, state, takes batches]
        self._channel_models: dict[str, str] = {}  # channel id -> model
        # Submission batches written and their requests not all over for their callers: a
        # batch the replica refuses as a whole fails each of them (batch id -> request ids).
        self._batches: dict[str, set[str]] = {}
        self._batch_of: dict[str, str] = {}  # request id -> its batch's id
        self.inboxes: dict[str, Inbox] = {}
        self.idle_since: float | None = self._loop.time()
        self.closing = False
        self.error: BaseException | None = None
        self._outbox: list = []
        self._writer: asyncio.Task | None = None
        self._closer: asyncio.Task | None = None  # held: the loop keeps only weak references
        self._reader = self._loop.create_task(self._read())

    def __len__(self) -> int:
        return len(self.inboxes)

    def channel(self, model_name: str) -> str | None:
        """The channel a request for `model_name` names: its id once the replica acknowledged
        it; None before (the first request for the model opens it) and when refused."""
        entry = self._channel_of.get(model_name)
        if entry is not None:
            return entry[0] if entry[1] == OPEN else None
        if self._channels is None or self.closing or self.error is not None:
            return None
        channel_id = f"{_CHANNEL_PREFIX}-{next(_CHANNEL_IDS)}"
        self._channel_of[model_name] = [channel_id, OPENING, False]
        self._channel_models[channel_id] = model_name
        self.send(self._channels.command(model_name, channel_id, True))
        return None

    def _close_channels(self) -> None:
        for model_name, entry in self._channel_of.items():
            if entry[1] == OPEN:
                entry[1] = REFUSED  # closed: no request names it any more
                self.send(self._channels.command(model_name, entry[0], False))

    def _on_channel(self, channel_id: str, response) -> None:
        """The reader, for a response on one of this call's channels."""
        entry = self._channel_of[self._channel_models[channel_id]]
        if response.error_message:  # a replica without channels refused to open one
            if entry[1] == OPENING:
                logger.info("the replica refused a channel (%s): requests stream on their own",
                            response.error_message)
            entry[1] = REFUSED
            return
        if entry[1] == OPENING and self._channels.is_ack(response.infer_response):
            entry[1] = OPEN
            entry[2] = self._channels.takes_batches(response.infer_response)
            if self.closing:
                self._close_channels()
            return
        inboxes = self.inboxes
        for request_id, chunk in self._channels.entries(response.infer_response):
            inbox = inboxes.get(request_id)
            if inbox is not None:  # else a request its caller has left
                inbox.responses.append(chunk)
                inbox._wake()

    def open(self, request_id: str) -> Inbox:
        inbox = self.inboxes[request_id] = Inbox()
        self.idle_since = None
        return inbox

    def forget(self, request_id: str) -> None:
        """The request is over for its caller: later responses for it are dropped."""
        inboxes = self.inboxes
        inboxes.pop(request_id, None)
        batch_id = self._batch_of.pop(request_id, None)
        if batch_id is not None:
            members = self._batches[batch_id]
            members.discard(request_id)
            if not members:
                del self._batches[batch_id]
        if not inboxes:
            self.idle_since = self._loop.time()

    def flushed(self) -> bool:
        """Nothing queued or being written (an abandoned request's abort goes out before the
        call is closed)."""
        return self._writer is None and not self._outbox

    def send(self, message) -> None:
        """Queues `message` for this call (in order); the writer task sends it."""
        self._outbox.append(message)
        if self._writer is None and self.error is None:
            self._writer = self._loop.create_task(self._write())

    def submit(self, submission: Submission) -> None:
        """Queues a generation request (in order with everything else sent on this call)."""
        self.send(submission)

    def _messages(self, queued: list) -> list:
        """The outbox as messages: consecutive submissions for one channel that takes
        submission batches go as one batch (MAX_BATCH at most), the rest as they are."""
        messages, run = [], []
        for item in queued:
            if type(item) is not Submission:
                self._flush_run(run, messages)
                messages.append(item)
                continue
            channel = item.channel
            entry = self._channel_of.get(item.model_name)
            batches = (channel is not None and entry is not None and entry[0] == channel
                       and entry[1] == OPEN and entry[2])
            if run and (not batches or run[0].channel != channel or len(run) == MAX_BATCH):
                self._flush_run(run, messages)
            if batches:
                run.append(item)
            else:
                messages.append(item.message())
        self._flush_run(run, messages)
        return messages

    def _flush_run(self, run: list, messages: list) -> None:
        if not run:
            return
        if len(run) == 1:
            messages.append(run[0].message())
        else:
            batch_id = f"{_BATCH_PREFIX}-{next(_BATCH_IDS)}"
            members = set()
            for submission in run:
                if submission.request_id in self.inboxes:  # else its caller already left
                    members.add(submission.request_id)
                    self._batch_of[submission.request_id] = batch_id
            if members:
                self._batches[batch_id] = members
            messages.append(self._channels.batch(run[0].model_name, batch_id, run))
        run.clear()

    async def _write(self) -> None:
        outbox, write = self._outbox, self._call.write
        try:
            while outbox and self.error is None:
                batch, self._outbox = self._messages(outbox), []
                for message in batch:
                    await write(message)
                outbox = self._outbox
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - grpc.aio's errors of a call that ended
            self._end(exc)
        finally:
            self._writer = None

    async def _read(self) -> None:
        read, inboxes = self._call.read, self.inboxes
        try:
            while True:
                response = await read()
                if response is grpc.aio.EOF:
                    self._end(ReplicaStreamError("the replica closed the stream before the end")
                              if not self.closing else None)
                    return
                request_id = response.infer_response.id
                inbox = inboxes.get(request_id)
                if inbox is None:
                    if request_id in self._channel_models:
                        self._on_channel(request_id, response)
                        continue
                    members = self._batches.pop(request_id, None)
                    if members is not None:  # a submission batch refused as a whole
                        for member in members:
                            self._batch_of.pop(member, None)
                            member_inbox = inboxes.get(member)
                            if member_inbox is not None:
                                member_inbox.responses.append(response)
                                member_inbox._wake()
                        continue
                    if response.error_message and not request_id:
                        # A refusal that names no request: every request on the call gets it.
                        self._end(ReplicaStreamError(response.error_message), response)
                        return
                    continue  # a request its caller has left (an abort's answer, a late token)
                inbox.responses.append(response)
                inbox._wake()
        except asyncio.CancelledError:
            self._end(ReplicaUnavailable("the platform closed the replica's stream"))
            raise
        except Exception as exc:  # noqa: BLE001 - AioRpcError and the like: the call is over
            self._end(exc)

    def _end(self, error: BaseException | None, response=None) -> None:
        """The call is over: every request still on it gets `error` (or `response`, an error
        reply that named none of them), and the pool forgets the call."""
        if self.error is not None:
            return
        self.error = error if error is not None else ReplicaStreamError("the stream was closed")
        for inbox in self.inboxes.values():
            if response is not None:
                inbox.responses.append(response)
            else:
                inbox.error = self.error
            inbox._wake()
        self._on_end(self)

    def close_when_idle(self) -> None:
        """Ends the call from our side (no request is on it): the replica then ends it."""
        self.closing = True
        self._on_end(self)
        self._closer = self._loop.create_task(self.end())

    async def end(self, timeout_s: float = 2.0) -> None:
        """Half-closes the call and waits (at most `timeout_s`) for the replica to end it;
        cancels it otherwise."""
        self.closing = True
        try:
            async with asyncio.timeout(timeout_s):
                if self.error is None:
                    self._close_channels()
                while self._writer is not None:  # the channels' closes go out first
                    await asyncio.wait((self._writer,))
                await self._call.done_writing()
                await asyncio.wait((self._reader,))
        except asyncio.CancelledError:
            self.cancel()
            raise
        except Exception:  # noqa: BLE001 - ended already, or too slow: cancel it
            self.cancel()

    def cancel(self) -> None:
        self.closing = True
        self._reader.cancel()
        if self._writer is not None:
            self._writer.cancel()
        self._call.cancel()


class CallPool:
    """Up to `size` shared calls to one replica address."""

    def __init__(self, open_call: Callable[[], grpc.aio.StreamStreamCall], size: int,
                 idle_s: float, channels: ChannelSupport | None = None):
        self._open_call = open_call
        self._channels = channels
        self._size = max(1, size)
        self._idle_s = idle_s
        self.calls: list[SharedCall] = []
        self._reaper: asyncio.TimerHandle | None = None

    def pick(self, request_id: str) -> SharedCall:
        """The open call with the fewest requests in flight; a new one while every open call
        is busy (or already carries `request_id`) and the pool has room."""
        best = None
        for call in self.calls:
            if request_id not in call.inboxes and (best is None or len(call) < len(best)):
                best = call
                if not best.inboxes:
                    break
        if best is None or (best.inboxes and len(self.calls) < self._size):
            best = SharedCall(self._open_call, self._forget, self._channels)
            self.calls.append(best)
            if self._reaper is None:
                self._arm_reaper()
        return best

    def _forget(self, call: SharedCall) -> None:
        try:
            self.calls.remove(call)
        except ValueError:
            pass

    def _arm_reaper(self) -> None:
        loop = asyncio.get_running_loop()
        self._reaper = loop.call_later(self._idle_s / 2, self._reap)

    def _reap(self) -> None:
        """Closes the calls idle for `idle_s` (one timer for the pool, armed while it has calls)."""
        self._reaper = None
        now = asyncio.get_running_loop().time()
        for call in list(self.calls):
            if call.idle_since is not None and now - call.idle_since >= self._idle_s \
                    and call.flushed():
                call.close_when_idle()
        if self.calls:
            self._arm_reaper()

    async def close(self) -> None:
        """Idle calls are half-closed (the replica ends them), busy ones cancelled."""
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        calls, self.calls = list(self.calls), []
        idle = [call for call in calls if not call.inboxes]
        for call in calls:
            if call.inboxes:
                call.cancel()
        await asyncio.gather(*(call.end() for call in idle), return_exceptions=True)
