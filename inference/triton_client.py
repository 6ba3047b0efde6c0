"""`ReplicaClient` over Triton's gRPC streaming API (`ModelStreamInfer`).

Tensor interface (mirrors Triton's vLLM backend): inputs text_input, stream, sampling_parameters
(JSON), exclude_input_in_output, input_ids, priority, cache_salt, tenant; outputs per response
text_output, finish_reason, num_input_tokens, num_output_tokens, num_cached_tokens, final.
A usage query (`usage`) sends the one input `control` and reads `control_output`.

The request protobuf is built here directly (`build_request`: the same message tritonclient
builds from `InferInput`s and numpy arrays, checked equal in tests/platform/test_triton_wire.py)
and each call is one `ModelStreamInfer` call on the replica's channel given that one message
(grpc.aio sends it and closes the call's side while the first response is awaited; writing it
with `write` and `done_writing` first delayed the first token of concurrent calls), no numpy, no
async generator to wrap it, no tritonclient wrapper per response. tritonclient's protobuf
messages and stub are the protocol; its client class is not on the request path.

Every call carries the replica access token (replica/access.py): a replica started by a node
agent refuses calls without it.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import os
import struct
import time
from typing import AsyncIterator

import grpc
import orjson
from tritonclient.grpc import InferResult, KeepAliveOptions, service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from inference.replica_client import (
    ReplicaChunk,
    ReplicaDead,
    ReplicaError,
    ReplicaRejected,
    ReplicaRequest,
    ReplicaRequestFailed,
    ReplicaStreamError,
    ReplicaUnavailable,
    ReplicaUsage,
)
from inference.triton_calls import CallPool, Submission
from replica.access import grpc_headers
from replica.backend import error_messages

INVALID_PREFIX = error_messages.INVALID_REQUEST
RESTRICTED = "This protocol is restricted"  # Triton's refusal of a call without the token
_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


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


def _bytes_tensor(value: str) -> bytes:
    """A one-element BYTES tensor's raw content: 4-byte little-endian length, the bytes."""
    data = value.encode("utf-8")
    return len(data).to_bytes(4, "little") + data


_TRUE = b"\x01"


def _add(request, name: str, datatype: str, shape: int, content: bytes) -> None:
    tensor = request.inputs.add()
    tensor.name = name
    tensor.datatype = datatype
    tensor.shape.append(shape)
    request.raw_input_contents.append(content)


def build_control_request(model_name: str, request_ids: list[str], abort: bool,
                          wait_s: float) -> service_pb2.ModelInferRequest:
    """A usage query (replica/backend/control_request.py)."""
    control = json.dumps({"usage": list(request_ids), "abort": abort, "wait_s": wait_s})
    request = service_pb2.ModelInferRequest(model_name=model_name)
    _add(request, "control", "BYTES", 1, _bytes_tensor(control))
    return request


def build_channel_command(model_name: str, channel_id: str,
                          open_: bool) -> service_pb2.ModelInferRequest:
    """Open a channel (this request becomes it) or close it (replica/backend/channel.py)."""
    command = {"channel": channel_id, "open": True} if open_ else {"channel": channel_id,
                                                                  "close": True}
    request = service_pb2.ModelInferRequest(
        model_name=model_name, id=channel_id if open_ else f"close-{channel_id}")
    _add(request, "control", "BYTES", 1, _bytes_tensor(json.dumps(command)))
    return request


class ChannelError:
    """A channel's error entry: the request it names failed (a submission batch's request has
    no response of its own to carry its error); `message` is the replica's wire message."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


def parse_channel_batch(response) -> list[tuple[str, ReplicaChunk | ChannelError]]:
    """A channel's batch (ModelInferResponse; replica/backend/channel.py): (request id, chunk)
    per entry, in order; an error entry (finish reason "error") as a ChannelError."""
    try:
        raw = response.raw_output_contents[0]
        entries = orjson.loads(raw[4:4 + int.from_bytes(raw[:4], "little")])
        return [(entry[0], ChannelError(entry[1]) if entry[2] == "error" else
                 ReplicaChunk(entry[1], entry[2], entry[3], entry[4], entry[5], entry[6]))
                for entry in entries]
    except (IndexError, TypeError, orjson.JSONDecodeError) as exc:
        raise ReplicaStreamError(f"unreadable channel batch: {exc}") from exc


def _takes_batches(response) -> bool:
    """A channel's acknowledgement says whether the replica takes submission batches
    (`{"channel": "open", "batches": true}`; a replica from before them sends no `batches`)."""
    try:
        raw = response.raw_output_contents[0]
        return orjson.loads(raw[4:4 + int.from_bytes(raw[:4], "little")]).get("batches") is True
    except (IndexError, AttributeError, orjson.JSONDecodeError):
        return False


def submission_entry(request: ReplicaRequest, channel: str) -> dict:
    """One request of a submission batch (replica/backend/submission_batch.py): the inputs
    `build_request` sends as tensors, as JSON."""
    entry = {
        "id": request.request_id,
        "channel": channel,
        "text_input": request.prompt_text,
        "stream": True,
        "sampling_parameters": _sampling_json(request),
        "exclude_input_in_output": True,
        "priority": request.priority,
        "cache_salt": request.cache_salt or request.tenant,
        "tenant": request.tenant,
    }
    if request.prompt_token_ids is not None:
        entry["input_ids"] = list(request.prompt_token_ids)
    return entry


def build_batch(model_name: str, batch_id: str, submissions) -> service_pb2.ModelInferRequest:
    """Several generation requests for one channel as one Triton request (input `batch`: the
    JSON list of their entries)."""
    message = service_pb2.ModelInferRequest(model_name=model_name, id=batch_id)
    payload = orjson.dumps([submission_entry(s.payload, s.channel) for s in submissions])
    _add(message, "batch", "BYTES", 1, len(payload).to_bytes(4, "little") + payload)
    return message


class _Channels:
    """The channel protocol for SharedCall (inference/triton_calls.ChannelSupport)."""

    command = staticmethod(build_channel_command)

    @staticmethod
    def is_ack(response) -> bool:
        outputs = response.outputs
        return len(outputs) == 1 and outputs[0].name == "control_output"

    takes_batches = staticmethod(_takes_batches)
    entries = staticmethod(parse_channel_batch)
    batch = staticmethod(build_batch)


def _sampling_json(request: ReplicaRequest) -> str:
    sampling = {
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop": list(request.stop),
    }
    if request.seed is not None:
        sampling["seed"] = request.seed
    return json.dumps(sampling)


def build_request(request: ReplicaRequest,
                  channel: str | None = None) -> service_pb2.ModelInferRequest:
    """The generation request as Triton's protobuf message (`channel`: the channel its
    outputs go out on)."""
    message = service_pb2.ModelInferRequest(model_name=request.model_name, id=request.request_id)
    _add(message, "text_input", "BYTES", 1, _bytes_tensor(request.prompt_text))
    _add(message, "stream", "BOOL", 1, _TRUE)
    _add(message, "sampling_parameters", "BYTES", 1, _bytes_tensor(_sampling_json(request)))
    _add(message, "exclude_input_in_output", "BOOL", 1, _TRUE)
    _add(message, "priority", "INT32", 1, request.priority.to_bytes(4, "little", signed=True))
    _add(message, "cache_salt", "BYTES", 1, _bytes_tensor(request.cache_salt or request.tenant))
    _add(message, "tenant", "BYTES", 1, _bytes_tensor(request.tenant))
    if request.prompt_token_ids is not None:
        ids = request.prompt_token_ids
        _add(message, "input_ids", "INT64", len(ids), struct.pack(f"<{len(ids)}q", *ids))
    if channel is not None:
        _add(message, "channel", "BYTES", 1, _bytes_tensor(channel))
    return message


def parse_usage(response, request_ids: list[str]) -> dict[str, ReplicaUsage]:
    """A usage query's answer (a ModelInferResponse)."""
    raw = _scalars(response).get("control_output")
    if raw is None:
        raise ReplicaStreamError("the replica answered a usage query without control_output")
    try:
        entries = json.loads(raw)["usage"]
        return {rid: ReplicaUsage(**entries[rid]) for rid in request_ids}
    except (ValueError, KeyError, TypeError) as exc:
        raise ReplicaStreamError(f"unreadable usage answer: {exc}") from exc


def _scalar(response, name: str, default):
    array = InferResult(response).as_numpy(name)
    if array is None or array.size == 0:
        return default
    value = array.reshape(-1)[0]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value.item() if hasattr(value, "item") else value


def _bytes_scalar(raw: bytes) -> str:
    """The first element of a serialized BYTES tensor (4-byte little-endian length, then the
    bytes)."""
    return raw[4:4 + int.from_bytes(raw[:4], "little")].decode("utf-8", errors="replace")


# One-element tensors read straight from the response's raw bytes: a streamed token's six
# outputs cost ~20 us through numpy (`as_numpy` per name), a few here.
_SCALAR_DECODERS = {
    "BYTES": _bytes_scalar,
    "BOOL": lambda raw: raw[:1] != b"\x00",
    "INT32": lambda raw: int.from_bytes(raw[:4], "little", signed=True),
    "INT64": lambda raw: int.from_bytes(raw[:8], "little", signed=True),
    "UINT32": lambda raw: int.from_bytes(raw[:4], "little"),
    "UINT64": lambda raw: int.from_bytes(raw[:8], "little"),
}


def _scalars(response) -> dict:
    """name -> first element of every output of a ModelInferResponse, in one pass (outputs
    whose type has no decoder here go through tritonclient's `as_numpy`)."""
    raw_contents = response.raw_output_contents
    values = {}
    for index, output in enumerate(response.outputs):
        decode = _SCALAR_DECODERS.get(output.datatype)
        if decode is None or index >= len(raw_contents):
            values[output.name] = _scalar(response, output.name, None)
            continue
        raw = raw_contents[index]
        if raw:
            values[output.name] = decode(raw)
    return values


def parse_chunk(response, previous: ReplicaChunk | None = None) -> ReplicaChunk:
    """A streamed response (ModelInferResponse) as a chunk. The replica's responses between
    its first and its last carry only `text_output`, `num_output_tokens` and `final`
    (replica/backend/response_stream.py): the prompt's counts are the `previous` chunk's."""
    values = _scalars(response)
    get = values.get
    if previous is None:
        num_input, num_cached = int(get("num_input_tokens") or 0), int(get("num_cached_tokens") or 0)
    else:
        num_input = int(get("num_input_tokens", previous.num_input_tokens) or 0)
        num_cached = int(get("num_cached_tokens", previous.num_cached_tokens) or 0)
    return ReplicaChunk(
        text=get("text_output") or "",
        finish_reason=get("finish_reason") or "",
        num_input_tokens=num_input,
        num_output_tokens=int(get("num_output_tokens") or 0),
        num_cached_tokens=num_cached,
        final=bool(get("final") or False),
    )


def _chunk_of(response, previous: ReplicaChunk | None = None) -> ReplicaChunk:
    """A ModelStreamInferResponse as a chunk (`previous`: this request's chunk before it);
    its error message raised as the replica's error."""
    if response.error_message:
        raise classify(InferenceServerException(msg=response.error_message))
    return parse_chunk(response.infer_response, previous)


def _own(error: BaseException) -> Exception:
    """A shared call's end as this request's error: a copy of its ReplicaError (the one
    instance is not raised in every request's task), or the gRPC error classified."""
    if not isinstance(error, ReplicaError):
        return classify(error)
    return type(error)(*error.args)  # triton_calls ends calls with one-message errors


def classify(error: Exception) -> Exception:
    text = error.details() if isinstance(error, grpc.aio.AioRpcError) else str(error)
    if RESTRICTED in (text or ""):
        return ReplicaUnavailable("the replica refused the platform's access token "
                                  "(was it started with another REPLICA_SECRET?)")
    if isinstance(error, grpc.aio.AioRpcError):
        if error.code() in _UNAVAILABLE_CODES:
            return ReplicaUnavailable(error.details() or str(error.code()))
        return ReplicaStreamError(error.details() or str(error.code()))
    message = error.message() if isinstance(error, InferenceServerException) else str(error)
    message = message or ""
    if INVALID_PREFIX in message:
        return ReplicaRejected(_after(message, INVALID_PREFIX))
    if error_messages.ENGINE_DEAD in message:
        return ReplicaDead(_after(message, error_messages.ENGINE_DEAD), in_flight=False)
    if error_messages.ENGINE_FAILED in message:
        return ReplicaDead(_after(message, error_messages.ENGINE_FAILED), in_flight=True)
    if error_messages.REQUEST_FAILED in message:
        return ReplicaRequestFailed(_after(message, error_messages.REQUEST_FAILED))
    if isinstance(error, InferenceServerException) and error.status() == "StatusCode.UNAVAILABLE":
        return ReplicaUnavailable(message)
    return ReplicaStreamError(message)


def _after(message: str, prefix: str) -> str:
    """The replica's message after its kind's prefix (Triton may put text before it)."""
    return message[message.index(prefix) + len(prefix):].strip()


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
                self._call_idle_s, _Channels() if self._channels else None)
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
                        chunk = _chunk_of(response, chunk)
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
                chunk = _chunk_of(response, chunk)
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
