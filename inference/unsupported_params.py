"""Request parameters the platform does not implement: refused by name, never ignored.

A body key (top level, in `stream_options`, or in a chat message) that its endpoint's
serializer does not declare is refused with 400 `invalid_request_error` and `param` naming it:
code `unsupported_parameter` for OpenAI parameters the platform does not implement (`tools`,
`response_format`, `logprobs`, `logit_bias`, the penalties, ...), `unknown_parameter` for
anything else. The one exception, on the OpenAI endpoints only: an OpenAI parameter whose
value is a no-op, one that would change nothing about the reply (`user`, `logprobs: false`,
`presence_penalty: 0`, `tools: []`, `response_format: {"type": "text"}`, any of them null),
is accepted. docs/api-errors.md lists them.
"""
from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from inference.errors import InvalidRequest


def _null(value) -> bool:
    return value is None


def _one_of(*allowed) -> Callable[[object], bool]:
    """None or a value equal to one of `allowed` (same JSON type: `False` is not `0`)."""
    return lambda value: value is None or any(
        type(value) is type(a) and value == a for a in allowed)


def _zero(value) -> bool:
    return value is None or (type(value) in (int, float) and value == 0)


def _string(value) -> bool:
    return value is None or isinstance(value, str)


def _boolean(value) -> bool:
    return value is None or isinstance(value, bool)


def _empty(value) -> bool:
    return value is None or value == [] or value == {}


def _string_map(value) -> bool:
    return value is None or (isinstance(value, dict)
                             and all(isinstance(v, str) for v in value.values()))


@dataclass(frozen=True)
class NoOp:
    """An OpenAI parameter the platform ignores when, and only when, `accepts(value)`."""

    accepts: Callable[[object], bool]
    values: str  # what is accepted, for the error message


_CHAT_AND_COMPLETIONS = {
    # End-user ids for the provider's abuse monitoring: nothing about generation.
    "user": NoOp(_string, "any string"),
    "frequency_penalty": NoOp(_zero, "0"),
    "presence_penalty": NoOp(_zero, "0"),
    "logit_bias": NoOp(_empty, "{}"),
}

NO_OPS: dict[str, dict[str, NoOp]] = {
    "chat": {
        **_CHAT_AND_COMPLETIONS,
        "safety_identifier": NoOp(_string, "any string"),
        "logprobs": NoOp(_one_of(False), "false"),
        "top_logprobs": NoOp(_one_of(0), "0"),
        "tools": NoOp(_empty, "[]"),
        "tool_choice": NoOp(_one_of("none"), '"none"'),
        "parallel_tool_calls": NoOp(_boolean, "true or false (there are no tools)"),
        "functions": NoOp(_empty, "[]"),
        "function_call": NoOp(_one_of("none"), '"none"'),
        "response_format": NoOp(_one_of({"type": "text"}), '{"type": "text"}'),
        "modalities": NoOp(_one_of(["text"]), '["text"]'),
        "audio": NoOp(_null, "null"),
        "prediction": NoOp(_null, "null"),
        "web_search_options": NoOp(_null, "null"),
        "reasoning_effort": NoOp(_one_of("none"), '"none"'),
        "verbosity": NoOp(_null, "null"),
        "store": NoOp(_one_of(False), "false"),
        # Tags of stored completions: with `store` false they go nowhere.
        "metadata": NoOp(_string_map, "an object of strings"),
        "service_tier": NoOp(_one_of("auto", "default"), '"auto" or "default"'),
        "moderation": NoOp(_null, "null"),
        # Prefix caching and its routing are automatic here; the hints change nothing.
        "prompt_cache_key": NoOp(_string, "any string"),
        "prompt_cache_retention": NoOp(_null, "null"),
        "prompt_cache_options": NoOp(_null, "null"),
    },
    "completions": {
        **_CHAT_AND_COMPLETIONS,
        "logprobs": NoOp(_one_of(False), "false"),  # an integer when implemented
        "best_of": NoOp(_one_of(1), "1"),
        "suffix": NoOp(_one_of(""), '""'),
    },
    "generate": {},
}

# stream_options: `include_usage` is implemented.
STREAM_OPTIONS_NO_OPS = {"include_obfuscation": NoOp(_one_of(False), "false")}

# A chat message's keys besides `role` and `content`.
MESSAGE_NO_OPS = {
    "refusal": NoOp(_null, "null"),
    "tool_calls": NoOp(_empty, "[]"),
    "function_call": NoOp(_null, "null"),
    "audio": NoOp(_null, "null"),
    "tool_call_id": NoOp(_null, "null"),
}
MESSAGE_KEYS = frozenset({"role", "content"})


def _check(obj: dict, accepted: Collection[str], no_ops: dict[str, NoOp], path: str) -> None:
    for key, value in obj.items():
        if key in accepted:
            continue
        param = f"{path}.{key}" if path else key
        no_op = no_ops.get(key)
        if no_op is None:
            raise InvalidRequest(f"Unrecognized request argument supplied: '{param}'.",
                                 code="unknown_parameter", param=param)
        if not no_op.accepts(value):
            values = no_op.values if no_op.values == "null" else f"{no_op.values} or null"
            raise InvalidRequest(
                f"Unsupported parameter: '{param}' is not implemented by this platform; it is "
                f"accepted only with a value that changes nothing: {values}.",
                code="unsupported_parameter", param=param)


def refuse_unsupported(body: dict, accepted: Collection[str], no_ops: dict[str, NoOp], *,
                       openai: bool) -> None:
    """Raise InvalidRequest (400) for the first parameter of `body` that is neither in
    `accepted` (what the endpoint's serializer implements) nor one of its accepted `no_ops`
    (`NO_OPS[name]`, carried by its inference.endpoints.EndpointKind). `openai`: the OpenAI
    endpoints' no-ops in `stream_options` and messages apply too (the native endpoint takes its
    own parameters only). Shapes are the serializer's to check: a `messages` that is not a list
    of objects is left to it."""
    _check(body, accepted, no_ops, "")
    stream_options = body.get("stream_options")
    if isinstance(stream_options, dict):
        _check(stream_options, {"include_usage"}, STREAM_OPTIONS_NO_OPS if openai else {},
               "stream_options")
    messages = body.get("messages")
    if isinstance(messages, list):
        for index, message in enumerate(messages):
            if isinstance(message, dict):
                _check(message, MESSAGE_KEYS, MESSAGE_NO_OPS if openai else {},
                       f"messages.{index}")
