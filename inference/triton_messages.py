"""Triton's protobuf messages as the platform writes and reads them.

Tensor interface (mirrors Triton's vLLM backend): inputs text_input, stream, sampling_parameters
(JSON), exclude_input_in_output, input_ids, priority, cache_salt, tenant; outputs per response
text_output, finish_reason, num_input_tokens, num_output_tokens, num_cached_tokens, final.
A usage query sends the one input `control` and reads `control_output`; channel commands too
(replica/backend/channel.py); a submission batch sends the one input `batch`
(replica/backend/submission_batch.py).

The request protobuf is built here directly (`build_request`: the same message tritonclient
builds from `InferInput`s and numpy arrays, checked equal in tests/platform/test_triton_wire.py),
and responses are read from their raw bytes (`parse_chunk`): no numpy, no tritonclient wrapper
per response. `classify` turns the replica's error messages (by their prefix,
replica/backend/error_messages.py) and gRPC's errors into the platform's ReplicaErrors.
inference/triton_client.py is the client that sends and reads them.
"""
from __future__ import annotations

import json
import struct

import grpc
import orjson
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException

from inference.replica_client import (
    ReplicaChunk,
    ReplicaDead,
    ReplicaRejected,
    ReplicaRequest,
    ReplicaRequestFailed,
    ReplicaStreamError,
    ReplicaUnavailable,
    ReplicaUsage,
)
from replica.backend import error_messages

INVALID_PREFIX = error_messages.INVALID_REQUEST
RESTRICTED = "This protocol is restricted"  # Triton's refusal of a call without the token
_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def _bytes_tensor(value: str | bytes) -> bytes:
    """A one-element BYTES tensor's raw content: 4-byte little-endian length, the bytes."""
    data = value.encode("utf-8") if isinstance(value, str) else value
    return len(data).to_bytes(4, "little") + data


def _first_element(raw: bytes) -> bytes:
    """The first element of a serialized BYTES tensor (the inverse of `_bytes_tensor`)."""
    return raw[4:4 + int.from_bytes(raw[:4], "little")]


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
        entries = orjson.loads(_first_element(raw))
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
        return orjson.loads(_first_element(raw)).get("batches") is True
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
    _add(message, "batch", "BYTES", 1, _bytes_tensor(payload))
    return message


class Channels:
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
    return _first_element(raw).decode("utf-8", errors="replace")


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


def chunk_of(response, previous: ReplicaChunk | None = None) -> ReplicaChunk:
    """A ModelStreamInferResponse as a chunk (`previous`: this request's chunk before it);
    its error message raised as the replica's error."""
    if response.error_message:
        raise classify(InferenceServerException(msg=response.error_message))
    return parse_chunk(response.infer_response, previous)


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
