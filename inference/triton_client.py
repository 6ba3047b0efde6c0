"""`ReplicaClient` over Triton's gRPC streaming API (`ModelStreamInfer`).

The messages it writes and reads are built and parsed in inference/triton_messages.py (the
tensor interface, submission batches, error classification). Requests share a few long-lived
calls per replica (inference/triton_calls.py); with `calls_per_replica` 0 each request is one
`ModelStreamInfer` call given its one message (grpc.aio sends it and closes the call's side
while the first response is awaited; writing it with `write` and `done_writing` first delayed
the first token of concurrent calls). tritonclient's protobuf messages and stub are the
protocol; its client class is not on the request path.

Every call carries the replica access token (replica/access.py): a replica started by a node
agent refuses calls without it.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import time
from typing import AsyncIterator

import grpc
from tritonclient.grpc import KeepAliveOptions, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inference.replica_client import (
    ReplicaChunk,
    ReplicaError,
    ReplicaRequest,
    ReplicaStreamError,
    ReplicaUnavailable,
    ReplicaUsage,
)
from inference.triton_calls import CallPool, Submission
from inference.triton_messages import (
    ChannelError,
    Channels,
    build_control_request,
    build_request,
    chunk_of,
    classify,
    parse_usage,
)
from replica.access import grpc_headers


# Triton's own bound on a gRPC message (INT32_MAX), as tritonclient sets it on its channels.
MAX_MESSAGE_BYTES = 2**31 - 1


def _channel_options() -> list[tuple[str, int]]:
    """tritonclient's channel options (its KeepAliveOptions defaults)."""
    keepalive = KeepAliveOptions()
    return [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", keepalive.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", keepalive.keepalive_permit_without_calls),
        ("grpc.http2.max_pings_without_data", keepalive.http2_max_pings_without_data),
    ]


def _own(error: BaseException) -> Exception:
    """A shared call's end as this request's error: a copy of its ReplicaError (the one
    instance is not raised in every request's task), or the gRPC error classified."""
    if not isinstance(error, ReplicaError):
        return classify(error)
    return type(error)(*error.args)  # triton_calls ends calls with one-message errors


class _SilenceWatch:
    """A stream's limit on the replica's silence without a timer per token.

    `asyncio.timeout` around each read cost a Timeout, a TimerHandle and a heap push and cancel
    per streamed token (~6 % of the API's CPU per token). Here the stream sets `since` when it
    starts waiting (None when not waiting: the time its consumer takes between tokens does not
    count) and one timer, re-armed only when it fires (about once per `limit` seconds), checks
    it: a wait that has lasted `limit` seconds cancels the task, and the stream then turns that
    cancellation into ReplicaUnavailable, as asyncio.timeout turns its own into TimeoutError
    (`expired`: a cancellation from elsewhere, alone or at the same time, stays a
    cancellation)."""

    __slots__ = ("limit", "since", "now", "task", "_cancelling", "_fired", "_handle", "_loop")

    def __init__(self, limit: float):
        self._loop = asyncio.get_running_loop()
        self.now = self._loop.time
        self.limit = limit
        self.since: float | None = None
        self.task: asyncio.Task | None = None
        self._cancelling = 0
        self._fired = False
        self._handle = self._loop.call_at(self.now() + limit, self._check)

    def bind(self, task: asyncio.Task) -> None:
        """The task whose waits are watched from now on (and its cancellations so far)."""
        self.task, self._cancelling = task, task.cancelling()

    def set_limit(self, limit: float) -> None:
        self.limit = limit
        self.stop()
        self._handle = self._loop.call_at(self.now() + limit, self._check)

    def answered(self, token_limit: float) -> None:
        """A response came: from now on the limit is the one between tokens."""
        if self.limit != token_limit:
            self.set_limit(token_limit)

    def _check(self) -> None:
        since, now = self.since, self.now()
        if since is not None and now - since >= self.limit:
            self._handle = None
            self._fired = True
            self.task.cancel()
            return
        self._handle = self._loop.call_at((now if since is None else since) + self.limit,
                                          self._check)

    def expired(self) -> bool:
        """After a CancelledError at a wait: whether it was this watch's alone (the task's
        cancellation is then withdrawn)."""
        if not self._fired:
            return False
        self._fired = False
        return self.task.uncancel() <= self._cancelling

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class TritonReplicaClient:
    """Requests to replicas over a few long-lived `ModelStreamInfer` calls per replica
    address (inference/triton_calls.py), on one gRPC channel per address (channels and calls
    are bound to the event loop that made them, so one instance per loop: see
    inference.container). `calls_per_replica` 0: a call per request (the former way, kept
    for comparison: `TRITON_CALLS_PER_REPLICA=0`)."""

    def __init__(self, first_token_timeout: float, token_timeout: float, access_token: str = "",
                 calls_per_replica: int = 16, call_idle_s: float = 1.0,
                 channels: bool = True):
        self._first_token_timeout = first_token_timeout
        self._token_timeout = token_timeout
        headers = grpc_headers(access_token)
        self._metadata = tuple(headers.items()) if headers else ()
        self._calls_per_replica = calls_per_replica
        self._call_idle_s = call_idle_s
        self._channels = channels
        self._stubs: dict[str, tuple[grpc.aio.Channel, service_pb2_grpc.GRPCInferenceServiceStub]] = {}
        self._pools: dict[str, CallPool] = {}
        self._control_ids = itertools.count()

    def _stub(self, address: str) -> service_pb2_grpc.GRPCInferenceServiceStub:
        entry = self._stubs.get(address)
        if entry is None:
            channel = grpc.aio.insecure_channel(address, options=_channel_options())
            entry = self._stubs[address] = (channel,
                                            service_pb2_grpc.GRPCInferenceServiceStub(channel))
        return entry[1]

    def _pool(self, address: str) -> CallPool:
        pool = self._pools.get(address)
        if pool is None:
            stub, metadata = self._stub(address), self._metadata
            pool = self._pools[address] = CallPool(
                lambda: stub.ModelStreamInfer(metadata=metadata), self._calls_per_replica,
                self._call_idle_s, Channels() if self._channels else None)
        return pool

    def _call(self, address: str, message):
        """A ModelStreamInfer call of its own sending `message` (grpc.aio writes it, then
        closes the call's side, while the caller already waits for the first response) and
        its responses' iterator."""
        call = self._stub(address).ModelStreamInfer((message,), metadata=self._metadata)
        return call, call.__aiter__()

    def stream(self, address: str, request: ReplicaRequest) -> AsyncIterator[ReplicaChunk]:
        if self._calls_per_replica <= 0:
            return self._stream_alone(address, request)
        return self._stream_shared(address, request)

    async def _stream_shared(self, address: str,
                             request: ReplicaRequest) -> AsyncIterator[ReplicaChunk]:
        request_id = request.request_id
        call = self._pool(address).pick(request_id)
        channel = call.channel(request.model_name) if self._channels else None
        inbox = call.open(request_id)
        call.submit(Submission(request_id, request.model_name, channel, request, build_request))
        ended = False  # the replica ended the request (its final response, or an error)
        chunk = None
        watch = _SilenceWatch(self._first_token_timeout)
        current_task = asyncio.current_task
        try:
            while not ended:
                if not inbox.responses:
                    if inbox.error is not None:
                        ended = True
                        raise _own(inbox.error)
                    # The first wait runs in the request's task, the rest in the relay's pump.
                    task = current_task()
                    if task is not watch.task:
                        watch.bind(task)
                    watch.since = watch.now()
                    try:
                        await inbox.arrival()
                    except asyncio.CancelledError:
                        if watch.expired():
                            raise ReplicaUnavailable(
                                f"no response from the replica for {watch.limit:g} s") from None
                        raise
                    finally:
                        watch.since = None
                    continue
                responses, inbox.responses = inbox.responses, []
                for response in responses:
                    if type(response) is ReplicaChunk:  # a channel's entry
                        chunk = response
                    elif type(response) is ChannelError:  # its error, on the channel
                        ended = True
                        raise classify(InferenceServerException(msg=response.message))
                    elif not (response.error_message or response.infer_response.outputs):
                        continue  # an empty completion (a request on a channel ends so)
                    else:
                        ended = True  # an error reply ends the request too
                        chunk = chunk_of(response, chunk)
                    ended = chunk.final
                    watch.answered(self._token_timeout)
                    yield chunk
                    if ended:
                        break
        finally:
            watch.stop()
            call.forget(request_id)
            if not ended and call.error is None:
                # Abandoned (client gone, a timeout, the caller closed the iterator): the
                # replica stops generating it (the abort control request, on the same call;
                # its answer is dropped). Cancelling the call would cancel every request on it.
                abort = build_control_request(request.model_name, [request_id], True, 0.0)
                abort.id = f"abort-{request_id}"
                call.send(abort)

    async def _stream_alone(self, address: str,
                            request: ReplicaRequest) -> AsyncIterator[ReplicaChunk]:
        message = build_request(request)
        finished = False
        chunk = None
        call, responses = self._call(address, message)
        watch = _SilenceWatch(self._first_token_timeout)
        current_task = asyncio.current_task
        try:
            while not finished:
                # The first read runs in the request's task, the rest in the relay's pump.
                task = current_task()
                if task is not watch.task:
                    watch.bind(task)
                watch.since = watch.now()
                try:
                    response = await anext(responses)
                except StopAsyncIteration:
                    raise ReplicaStreamError("the replica closed the stream before the end")
                except asyncio.CancelledError:
                    if watch.expired():
                        raise ReplicaUnavailable(
                            f"no response from the replica for {watch.limit:g} s") from None
                    raise
                except grpc.aio.AioRpcError as exc:
                    raise classify(exc) from exc
                finally:
                    watch.since = None
                chunk = chunk_of(response, chunk)
                finished = chunk.final
                watch.answered(self._token_timeout)
                yield chunk
        finally:
            watch.stop()
            if not finished:
                call.cancel()  # the replica sees is_cancelled() and frees the sequence

    async def usage(self, address: str, model_name: str, request_ids: list[str], *,
                    abort: bool = False, wait_s: float = 0.0) -> dict[str, ReplicaUsage]:
        message = build_control_request(model_name, request_ids, abort, wait_s)
        if self._calls_per_replica <= 0:
            return await self._usage_alone(address, message, request_ids, wait_s)
        control_id = message.id = f"usage-{os.getpid()}-{next(self._control_ids)}"
        call = self._pool(address).pick(control_id)
        inbox = call.open(control_id)
        call.send(message)
        try:
            async with asyncio.timeout(wait_s + self._token_timeout):
                while not inbox.responses:
                    if inbox.error is not None:
                        raise _own(inbox.error)
                    await inbox.arrival()
        except TimeoutError:
            raise ReplicaUnavailable("no answer to a usage query") from None
        finally:
            call.forget(control_id)
        response = inbox.responses[0]
        if response.error_message:
            raise classify(InferenceServerException(msg=response.error_message))
        return parse_usage(response.infer_response, request_ids)

    async def _usage_alone(self, address: str, message, request_ids: list[str],
                           wait_s: float) -> dict[str, ReplicaUsage]:
        call, responses = self._call(address, message)
        try:
            async with asyncio.timeout(wait_s + self._token_timeout):
                response = await anext(responses)
        except StopAsyncIteration:
            raise ReplicaStreamError("the replica closed the stream without an answer") from None
        except TimeoutError:
            raise ReplicaUnavailable("no answer to a usage query") from None
        except grpc.aio.AioRpcError as exc:
            raise classify(exc) from exc
        finally:
            call.cancel()
        if response.error_message:
            raise classify(InferenceServerException(msg=response.error_message))
        return parse_usage(response.infer_response, request_ids)

    async def close(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            await pool.close()
        stubs, self._stubs = self._stubs, {}
        for channel, _ in stubs.values():
            await channel.close()


async def warm_up(grpc_address: str, model_name: str, access_token: str) -> ReplicaChunk:
    """One short generation ("Hello", 2 tokens, greedy) through this client, so the replica
    answers for real: the node agent runs it before it marks a replica ready, the chaos
    benchmark after each start. Returns the final chunk (the tokens the replica computed)."""
    client = TritonReplicaClient(first_token_timeout=120.0, token_timeout=60.0,
                                 access_token=access_token)
    try:
        request = ReplicaRequest(request_id=f"warmup-{os.getpid()}-{time.monotonic_ns()}",
                                 model_name=model_name, prompt_text="Hello", prompt_token_ids=None,
                                 max_tokens=2, temperature=0.0, top_p=1.0, seed=0, stop=(),
                                 priority=0, tenant="warmup")
        async for chunk in client.stream(grpc_address, request):
            if chunk.final:
                return chunk
        raise RuntimeError("warm-up stream ended without a final response")
    finally:
        await client.close()
