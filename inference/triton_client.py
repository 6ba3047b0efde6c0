"""`ReplicaClient` over Triton's gRPC streaming API (`tritonclient.grpc.aio`).

Tensor interface (mirrors Triton's vLLM backend): inputs text_input, stream, sampling_parameters
(JSON), exclude_input_in_output, input_ids, priority, cache_salt, tenant; outputs per response
text_output, finish_reason, num_input_tokens, num_output_tokens, num_cached_tokens, final.
A usage query (`usage`) sends the one input `control` and reads `control_output`.

Every call carries the replica access token (replica/access.py): a replica started by a node
agent refuses calls without it.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from typing import AsyncIterator

import grpc
import numpy as np
import tritonclient.grpc.aio as triton_aio
from tritonclient.grpc import InferInput
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
from replica.access import grpc_headers
from replica.backend import error_messages

INVALID_PREFIX = error_messages.INVALID_REQUEST
RESTRICTED = "This protocol is restricted"  # Triton's refusal of a call without the token
_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def _tensor(name: str, array: np.ndarray, datatype: str) -> InferInput:
    value = InferInput(name, list(array.shape), datatype)
    value.set_data_from_numpy(array)
    return value


def _text(value: str) -> np.ndarray:
    return np.array([value.encode("utf-8")], dtype=np.object_)


def build_control_inputs(request_ids: list[str], abort: bool, wait_s: float) -> list[InferInput]:
    """A usage query (replica/backend/control_request.py)."""
    control = json.dumps({"usage": list(request_ids), "abort": abort, "wait_s": wait_s})
    return [_tensor("control", _text(control), "BYTES")]


def parse_usage(result, request_ids: list[str]) -> dict[str, ReplicaUsage]:
    raw = _scalar(result, "control_output", None)
    if raw is None:
        raise ReplicaStreamError("the replica answered a usage query without control_output")
    try:
        entries = json.loads(raw)["usage"]
        return {rid: ReplicaUsage(**entries[rid]) for rid in request_ids}
    except (ValueError, KeyError, TypeError) as exc:
        raise ReplicaStreamError(f"unreadable usage answer: {exc}") from exc


def build_inputs(request: ReplicaRequest) -> list[InferInput]:
    sampling = {
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop": list(request.stop),
    }
    if request.seed is not None:
        sampling["seed"] = request.seed
    inputs = [
        _tensor("text_input", _text(request.prompt_text), "BYTES"),
        _tensor("stream", np.array([True], dtype=bool), "BOOL"),
        _tensor("sampling_parameters", _text(json.dumps(sampling)), "BYTES"),
        _tensor("exclude_input_in_output", np.array([True], dtype=bool), "BOOL"),
        _tensor("priority", np.array([request.priority], dtype=np.int32), "INT32"),
        _tensor("cache_salt", _text(request.cache_salt or request.tenant), "BYTES"),
        _tensor("tenant", _text(request.tenant), "BYTES"),
    ]
    if request.prompt_token_ids is not None:
        ids = np.array(request.prompt_token_ids, dtype=np.int64)
        inputs.append(_tensor("input_ids", ids, "INT64"))
    return inputs


def _scalar(result, name: str, default):
    array = result.as_numpy(name)
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


def _scalars(result) -> dict:
    """name -> first element of every output, in one pass over the response (outputs whose
    type has no decoder here go through `as_numpy`)."""
    response = result.get_response()
    raw_contents = response.raw_output_contents
    values = {}
    for index, output in enumerate(response.outputs):
        decode = _SCALAR_DECODERS.get(output.datatype)
        if decode is None or index >= len(raw_contents):
            values[output.name] = _scalar(result, output.name, None)
            continue
        raw = raw_contents[index]
        if raw:
            values[output.name] = decode(raw)
    return values


def parse_chunk(result) -> ReplicaChunk:
    values = _scalars(result)
    get = values.get
    return ReplicaChunk(
        text=get("text_output") or "",
        finish_reason=get("finish_reason") or "",
        num_input_tokens=int(get("num_input_tokens") or 0),
        num_output_tokens=int(get("num_output_tokens") or 0),
        num_cached_tokens=int(get("num_cached_tokens") or 0),
        final=bool(get("final") or False),
    )


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


class TritonReplicaClient:
    """One gRPC channel per replica address (channels are bound to the event loop that made
    them, so one instance per loop: see inference.container)."""

    def __init__(self, first_token_timeout: float, token_timeout: float, access_token: str = ""):
        self._first_token_timeout = first_token_timeout
        self._token_timeout = token_timeout
        self._headers = grpc_headers(access_token)
        self._clients: dict[str, triton_aio.InferenceServerClient] = {}

    def _client(self, address: str) -> triton_aio.InferenceServerClient:
        client = self._clients.get(address)
        if client is None:
            client = triton_aio.InferenceServerClient(address)
            self._clients[address] = client
        return client

    async def stream(self, address: str, request: ReplicaRequest) -> AsyncIterator[ReplicaChunk]:
        inputs = build_inputs(request)

        async def requests():
            yield {"model_name": request.model_name, "inputs": inputs,
                   "request_id": request.request_id}

        call = self._client(address).stream_infer(requests(), headers=self._headers)
        finished = False
        timeout = self._first_token_timeout
        try:
            while not finished:
                try:
                    # asyncio.timeout, not wait_for: no task of its own per token.
                    async with asyncio.timeout(timeout):
                        result, error = await anext(call)
                except StopAsyncIteration:
                    raise ReplicaStreamError("the replica closed the stream before the end")
                except TimeoutError:
                    raise ReplicaUnavailable(f"no response from the replica for {timeout:g} s")
                except (grpc.aio.AioRpcError, InferenceServerException) as exc:
                    raise classify(exc) from exc
                if error is not None:
                    raise classify(error)
                chunk = parse_chunk(result)
                finished = chunk.final
                timeout = self._token_timeout
                yield chunk
        finally:
            if not finished:
                call.cancel()  # the replica sees is_cancelled() and frees the sequence

    async def usage(self, address: str, model_name: str, request_ids: list[str], *,
                    abort: bool = False, wait_s: float = 0.0) -> dict[str, ReplicaUsage]:
        inputs = build_control_inputs(request_ids, abort, wait_s)

        async def requests():
            yield {"model_name": model_name, "inputs": inputs}

        call = self._client(address).stream_infer(requests(), headers=self._headers)
        try:
            result, error = await asyncio.wait_for(call.__anext__(), wait_s + self._token_timeout)
        except StopAsyncIteration:
            raise ReplicaStreamError("the replica closed the stream without an answer") from None
        except asyncio.TimeoutError:
            raise ReplicaUnavailable("no answer to a usage query") from None
        except (grpc.aio.AioRpcError, InferenceServerException) as exc:
            raise classify(exc) from exc
        finally:
            call.cancel()
        if error is not None:
            raise classify(error)
        return parse_usage(result, request_ids)

    async def close(self) -> None:
        clients, self._clients = self._clients, {}
        for client in clients.values():
            await client.close()


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
