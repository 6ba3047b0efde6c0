"""Submission batches: one Triton request carrying several generation requests.

Sent one Triton request each, a burst of requests costs the platform a gRPC write per request
(writes on one stream go one at a time: a request of a 32-request burst waited ~10 ms at the
median for its write, benchmarks/README.md, round frontdoor13), and the replica a Triton
request and a bare completion per request through the stub's IPC. A batch
is one Triton request and one platform write for many requests; their outputs, as those of
any request on a channel, come back in the channel's batches (replica/backend/channel.py).
A replica says it takes batches in its channel's acknowledgement (`"batches": true`).

A batch request's one input is `batch` (BYTES, one element): UTF-8 JSON, a list of at most
MAX_BATCH sub-requests, each an object

    {"id": str, "channel": str, "text_input": str, "sampling_parameters": str,
     "stream": bool, "exclude_input_in_output": bool, "priority": int, "cache_salt": str,
     "tenant": str, "input_ids": [int, ...]}

`id` (1 to MAX_SUB_ID characters: the request id, as a lone request's Triton id) and `channel`
(an open channel's id: where its outputs and its error go) are required; every other key is
the input tensor of the same name, optional as that tensor is (a key left out is not sent;
`sampling_parameters` is the same JSON text the tensor holds). Each sub-request becomes the
numpy inputs GenerateRequest.from_inputs reads, so it gets every check a lone request gets;
a value of the wrong JSON type (null included) or an unknown key makes that sub-request
invalid, the others go on. A batch that cannot be read as a list of addressable sub-requests
(not JSON, not a list, too long, an entry that is not an object, a bad `id` or `channel`) is
refused whole: its error could reach no sub-request.

The batch request itself is completed at once (a bare final flag) once its sub-requests were
submitted; each sub-request's outputs and errors go out on its channel only.
"""
from __future__ import annotations

import json
from typing import NamedTuple

import numpy as np

from replica.backend.control_request import MAX_CHANNEL_ID
from replica.engine.sampling_params import InvalidRequestError

MAX_BATCH = 256
MAX_SUB_ID = 128

_TEXT_KEYS = ("text_input", "sampling_parameters", "cache_salt", "tenant")
_BOOL_KEYS = ("stream", "exclude_input_in_output")
_KEYS = frozenset(("id", "channel", "priority", "input_ids", *_TEXT_KEYS, *_BOOL_KEYS))
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class SubRequest(NamedTuple):
    id: str  # the platform's request id
    channel: str  # the open channel its outputs go out on
    inputs: dict[str, np.ndarray] | InvalidRequestError  # GenerateRequest.from_inputs' inputs


def parse_batch(array: np.ndarray) -> list[SubRequest]:
    """The `batch` input's sub-requests, in order. Raises InvalidRequestError for a batch that
    is malformed as a whole; a sub-request that is invalid on its own carries its error."""
    values = np.asarray(array).reshape(-1)
    if values.size != 1:
        raise InvalidRequestError("batch must hold exactly one element")
    raw = values[0]
    try:
        text = bytes(raw).decode("utf-8") if isinstance(raw, (bytes, np.bytes_)) else raw
        data = json.loads(text)
    except UnicodeDecodeError:
        raise InvalidRequestError("batch is not valid UTF-8") from None
    except (TypeError, ValueError, RecursionError):
        raise InvalidRequestError("batch is not valid JSON") from None
    if not isinstance(data, list):
        raise InvalidRequestError("batch must be a JSON list")
    if len(data) > MAX_BATCH:
        raise InvalidRequestError(f"batch holds {len(data)} requests, more than {MAX_BATCH}")
    subs = []
    for index, entry in enumerate(data):
        if not isinstance(entry, dict):
            raise InvalidRequestError(f"batch[{index}] must be a JSON object")
        sub_id, channel = entry.get("id"), entry.get("channel")
        if not isinstance(sub_id, str) or not 0 < len(sub_id) <= MAX_SUB_ID:
            raise InvalidRequestError(f"batch[{index}].id must be 1 to {MAX_SUB_ID} characters")
        if not isinstance(channel, str) or not 0 < len(channel) <= MAX_CHANNEL_ID:
            raise InvalidRequestError(
                f"batch[{index}].channel must be 1 to {MAX_CHANNEL_ID} characters")
        try:
            inputs: dict[str, np.ndarray] | InvalidRequestError = _inputs(entry)
        except InvalidRequestError as exc:
            inputs = exc
        subs.append(SubRequest(sub_id, channel, inputs))
    return subs


def _inputs(entry: dict) -> dict[str, np.ndarray]:
    """A sub-request's keys as the input tensors a lone request would carry."""
    unknown = set(entry) - _KEYS
    if unknown:
        raise InvalidRequestError(f"unknown keys in a batched request: {sorted(unknown)}")
    inputs = {"channel": _bytes("channel", entry["channel"])}
    for name in _TEXT_KEYS:
        if name in entry:
            inputs[name] = _bytes(name, entry[name])
    for name in _BOOL_KEYS:
        if name in entry:
            value = entry[name]
            if not isinstance(value, bool):
                raise InvalidRequestError(f"{name} must be BOOL")
            inputs[name] = np.array([value], dtype=np.bool_)
    if "priority" in entry:
        priority = entry["priority"]
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidRequestError("priority must be an integer")
        if not _INT32_MIN <= priority <= _INT32_MAX:
            raise InvalidRequestError("priority is out of the INT32 range")
        inputs["priority"] = np.array([priority], dtype=np.int32)
    if "input_ids" in entry:
        ids = entry["input_ids"]
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            raise InvalidRequestError("input_ids must be integers (INT64)")
        try:
            inputs["input_ids"] = np.array(ids, dtype=np.int64)
        except OverflowError:
            raise InvalidRequestError("input_ids must be integers (INT64)") from None
    return inputs


def _bytes(name: str, value: object) -> np.ndarray:
    if not isinstance(value, str):
        raise InvalidRequestError(f"{name} must be a string (BYTES)")
    try:
        return np.array([value.encode("utf-8")], dtype=np.object_)
    except UnicodeEncodeError:  # a lone surrogate ("\ud800" in the JSON)
        raise InvalidRequestError(f"{name} is not valid UTF-8") from None
