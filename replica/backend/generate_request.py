"""GenerateRequest: one Triton request's input tensors, validated.

The tensor interface mirrors Triton's vLLM backend (`text_input`, `stream`, `sampling_parameters`,
`exclude_input_in_output`) plus our optional `input_ids`, `priority`, `cache_salt`, `tenant` and
`channel`.
Triton's HTTP `generate_stream` does not enforce required inputs, so everything is checked here;
every failure is an InvalidRequestError whose message names the offending input.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from replica.backend.control_request import MAX_CHANNEL_ID
from replica.engine.sampling_params import InvalidRequestError, SamplingParams

INPUT_NAMES = (
    "text_input",
    "stream",
    "sampling_parameters",
    "exclude_input_in_output",
    "input_ids",
    "priority",
    "cache_salt",
    "tenant",
    "channel",
)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class GenerateRequest:
    text: str  # the prompt text; "" when only input_ids were sent
    prompt_token_ids: tuple[int, ...] | None  # None: tokenize `text`
    params: SamplingParams
    stream: bool  # False: one response with the whole text
    prepend_prompt: bool  # vLLM backend's `exclude_input_in_output == False`
    priority: int = 0
    cache_salt: str = ""
    tenant: str = ""
    channel: str = ""  # the channel its responses go out on (replica/backend/channel.py)

    @classmethod
    def from_inputs(cls, inputs: Mapping[str, np.ndarray | None]) -> "GenerateRequest":
        """`inputs` maps input names to the request's numpy arrays (None or absent: not sent).
        The prompt's tokens themselves (empty, outside the vocabulary, too long) are the
        engine's one check (`LLMEngine.check_prompt`, run when the loop takes the request)."""
        text = _optional_text(inputs, "text_input")
        prompt_token_ids = _optional_token_ids(inputs)
        if text is None and prompt_token_ids is None:
            raise InvalidRequestError("text_input is required (or input_ids)")
        if prompt_token_ids is None and not text:
            raise InvalidRequestError("text_input is empty")
        stream = _optional_bool(inputs, "stream", default=True)
        # vLLM backend: by default the prompt is excluded when streaming, included otherwise.
        exclude = _optional_bool(inputs, "exclude_input_in_output", default=stream)
        return cls(
            text=text or "",
            prompt_token_ids=prompt_token_ids,
            params=_sampling_params(inputs),
            stream=stream,
            prepend_prompt=not exclude,
            priority=_optional_int32(inputs, "priority", default=0),
            cache_salt=_optional_text(inputs, "cache_salt") or "",
            tenant=_optional_text(inputs, "tenant") or "",
            channel=_channel(inputs),
        )


def _channel(inputs: Mapping[str, np.ndarray | None]) -> str:
    channel = _optional_text(inputs, "channel") or ""
    if len(channel) > MAX_CHANNEL_ID:
        raise InvalidRequestError(f"channel is longer than {MAX_CHANNEL_ID} characters")
    return channel


def _scalar(inputs: Mapping[str, np.ndarray | None], name: str) -> Any | None:
    array = inputs.get(name)
    if array is None:
        return None
    array = np.asarray(array)
    if array.size != 1:
        raise InvalidRequestError(f"{name} must hold exactly one element, got shape {list(array.shape)}")
    return array.reshape(-1)[0]


def _optional_text(inputs: Mapping[str, np.ndarray | None], name: str) -> str | None:
    value = _scalar(inputs, name)
    if value is None:
        return None
    if isinstance(value, (bytes, np.bytes_)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidRequestError(f"{name} is not valid UTF-8") from None
    if isinstance(value, str):
        return value
    raise InvalidRequestError(f"{name} must be a string (BYTES)")


def _optional_bool(inputs: Mapping[str, np.ndarray | None], name: str, *, default: bool) -> bool:
    value = _scalar(inputs, name)
    if value is None:
        return default
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise InvalidRequestError(f"{name} must be BOOL")


def _optional_int32(inputs: Mapping[str, np.ndarray | None], name: str, *, default: int) -> int:
    value = _scalar(inputs, name)
    if value is None:
        return default
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise InvalidRequestError(f"{name} must be an integer")
    if not _INT32_MIN <= int(value) <= _INT32_MAX:
        raise InvalidRequestError(f"{name} is out of the INT32 range")
    return int(value)


def _optional_token_ids(inputs: Mapping[str, np.ndarray | None]) -> tuple[int, ...] | None:
    array = inputs.get("input_ids")
    if array is None:
        return None
    array = np.asarray(array)
    if array.dtype.kind not in "iu":
        raise InvalidRequestError("input_ids must be integers (INT64)")
    return tuple(int(i) for i in array.reshape(-1))


def _sampling_params(inputs: Mapping[str, np.ndarray | None]) -> SamplingParams:
    raw = _optional_text(inputs, "sampling_parameters")
    if raw is None or not raw.strip():
        return SamplingParams()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InvalidRequestError(f"sampling_parameters is not valid JSON: {exc.msg}") from None
    try:
        return SamplingParams.from_dict(data)
    except TypeError as exc:  # a field of the wrong JSON type
        raise InvalidRequestError(f"bad sampling_parameters: {exc}") from None
