"""ControlRequest: a request to the model that asks about requests instead of generating.

Sent on the same inference protocol as generation (so whatever guards it guards this), as the
one input `control` holding JSON: {"usage": [request ids], "abort": bool, "wait_s": float}.
The model aborts the listed requests when `abort` is true, waits up to `wait_s` for them to
finish, and answers one response whose `control_output` holds JSON
{"usage": {request id: ComputedUsage fields}}. A `control` that names a `channel` is a channel
command instead (`ChannelCommand`, replica/backend/channel.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from replica.engine.sampling_params import InvalidRequestError

MAX_REQUEST_IDS = 1000
MAX_CHANNEL_ID = 128
MAX_WAIT_S = 30.0


@dataclass(frozen=True)
class ControlRequest:
    request_ids: tuple[str, ...]
    abort: bool = False
    wait_s: float = 0.0

    @classmethod
    def from_data(cls, data: dict) -> "ControlRequest":
        ids = data.get("usage")
        if (not isinstance(ids, list) or len(ids) > MAX_REQUEST_IDS
                or not all(isinstance(i, str) and 0 < len(i) <= 128 for i in ids)):
            raise InvalidRequestError(
                f"control.usage must be a list of at most {MAX_REQUEST_IDS} request ids")
        abort = data.get("abort", False)
        wait_s = data.get("wait_s", 0.0)
        if not isinstance(abort, bool):
            raise InvalidRequestError("control.abort must be a boolean")
        if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) \
                or not 0.0 <= wait_s <= MAX_WAIT_S:
            raise InvalidRequestError(f"control.wait_s must be a number in [0, {MAX_WAIT_S:g}]")
        return cls(tuple(ids), abort, float(wait_s))


@dataclass(frozen=True)
class ChannelCommand:
    """{"channel": id, "open": true}: this request becomes the channel `id` (it stays open;
    its responses carry other requests' outputs, replica/backend/channel.py);
    {"channel": id, "close": true}: the channel ends (its request completes) and this request
    is answered."""

    channel: str
    open: bool

    @classmethod
    def from_data(cls, data: dict) -> "ChannelCommand":
        channel, opening, closing = data.get("channel"), data.get("open"), data.get("close")
        if not isinstance(channel, str) or not 0 < len(channel) <= MAX_CHANNEL_ID:
            raise InvalidRequestError(f"control.channel must be 1 to {MAX_CHANNEL_ID} characters")
        if (opening is True) == (closing is True) or set(data) - {"channel", "open", "close"}:
            raise InvalidRequestError('a channel command is {"channel": id, "open": true} or '
                                      '{"channel": id, "close": true}')
        return cls(channel, opening is True)


def parse_control(array: np.ndarray) -> "ControlRequest | ChannelCommand":
    """The `control` input: a usage query, or a channel command (it names a `channel`)."""
    values = np.asarray(array).reshape(-1)
    if values.size != 1:
        raise InvalidRequestError("control must hold exactly one element")
    raw = values[0]
    try:
        data = json.loads(bytes(raw) if isinstance(raw, (bytes, np.bytes_)) else raw)
    except (TypeError, ValueError, UnicodeDecodeError):
        raise InvalidRequestError("control is not valid JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("control must be a JSON object")
    if "channel" in data:
        return ChannelCommand.from_data(data)
    return ControlRequest.from_data(data)


def control_reply(usage: dict) -> bytes:
    return json.dumps({"usage": {rid: u.to_dict() for rid, u in usage.items()}},
                      separators=(",", ":")).encode()
