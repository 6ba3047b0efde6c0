"""Request validation (DRF serializers) into one normalized `GenerationRequest`.

Types are strict: a string where a number belongs is a 400, not a silent coercion. A parameter
no serializer declares is a 400 too (inference.unsupported_params), never silently ignored.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from rest_framework import serializers

from inference.errors import InvalidRequest
from inference.unsupported_params import refuse_unsupported
from replica.engine.sampling_params import GREEDY_TEMPERATURE

if TYPE_CHECKING:
    from inference.endpoints import EndpointKind

MAX_STOP_SEQUENCES = 4
ROLES = ("system", "developer", "user", "assistant", "tool")
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1  # OpenAI's: a signed 64-bit integer


@dataclass(frozen=True)
class Sampling:
    max_tokens: int | None  # None: the rest of the context window, up to a default
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]


@dataclass(frozen=True)
class GenerationRequest:
    endpoint: str  # "generate" | "chat" | "completions"
    model: str
    messages: tuple[dict, ...] | None  # [{"role", "content": str}] for chat-style endpoints
    prompt: str | None  # raw text for /v1/completions
    sampling: Sampling
    stream: bool
    include_usage: bool


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StopField(serializers.Field):
    """`stop`: a string or a list of up to four strings."""

    def to_internal_value(self, data):
        if data is None:
            return ()
        if isinstance(data, str):
            data = [data]
        if not isinstance(data, list) or not all(isinstance(s, str) and s for s in data):
            raise serializers.ValidationError("must be a non-empty string or a list of them")
        if len(data) > MAX_STOP_SEQUENCES:
            raise serializers.ValidationError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        return tuple(data)


class ContentField(serializers.Field):
    """Message content: a string, or a list of `{"type": "text", "text": ...}` parts."""

    def to_internal_value(self, data):
        if isinstance(data, str):
            return data
        if isinstance(data, list):
            texts = []
            for part in data:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(
                    part.get("text"), str
                ):
                    raise serializers.ValidationError("only text content parts are supported")
                texts.append(part["text"])
            return "".join(texts)
        raise serializers.ValidationError("must be a string or a list of text parts")


class MessageSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=ROLES)
    content = ContentField()


class StreamOptionsSerializer(serializers.Serializer):
    include_usage = StrictBooleanField(required=False, default=False)


class _SamplingSerializer(serializers.Serializer):
    model = StrictCharField(max_length=100)
    max_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1)
    temperature = StrictFloatField(required=False, allow_null=True, min_value=0.0, max_value=2.0)
    top_p = StrictFloatField(required=False, allow_null=True, min_value=0.0, max_value=1.0)
    seed = StrictIntegerField(required=False, allow_null=True, min_value=SEED_MIN,
                              max_value=SEED_MAX)
    stop = StopField(required=False, allow_null=True)
    stream = StrictBooleanField(required=False, allow_null=True, default=False)
    stream_options = StreamOptionsSerializer(required=False, allow_null=True)
    n = StrictIntegerField(required=False, allow_null=True, min_value=1, max_value=1)

    def validate_top_p(self, value):
        if value is not None and value <= 0.0:
            raise serializers.ValidationError("must be greater than 0")
        return value


class GenerateSerializer(_SamplingSerializer):
    messages = serializers.ListField(child=MessageSerializer(), min_length=1, max_length=1024)


class ChatSerializer(GenerateSerializer):
    max_completion_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1)


class CompletionsSerializer(_SamplingSerializer):
    prompt = serializers.JSONField()
    echo = StrictBooleanField(required=False, allow_null=True, default=False)

    def validate_prompt(self, value):
        if isinstance(value, list) and len(value) == 1:
            value = value[0]
        if not isinstance(value, str) or value == "":
            raise serializers.ValidationError("must be a non-empty string")
        return value

    def validate_echo(self, value):
        if value:
            raise serializers.ValidationError("echo is not supported")
        return value


def _first_error(errors, path: str = "") -> tuple[str, str]:
    """(param, message) of the first DRF error, with a dotted path like `messages.0.role`."""
    if isinstance(errors, dict):
        key, value = next(iter(errors.items()))
        sub = "" if key == "non_field_errors" else str(key)
        return _first_error(value, f"{path}.{sub}".strip(".") if sub else path)
    if isinstance(errors, list) and errors:
        first = errors[0]
        if isinstance(first, (dict, list)):
            for index, item in enumerate(errors):
                if item:
                    return _first_error(item, f"{path}.{index}".strip("."))
        return path, str(first)
    return path, str(errors)


def _unbind(field: serializers.Field) -> None:
    """Undo DRF's two-way binding of a used serializer's fields (each field's `parent` is the
    serializer that lists it), a reference cycle per field that only a garbage collection
    frees: ~115 objects per request, which piled up under load until a full collection paused
    the whole front end (20-100 ms every ~30 s). Unbound, they are freed at once."""
    fields = field.__dict__.pop("fields", None)  # the cached `fields`: a BindingDict
    children = list(fields.values()) if fields is not None else []
    child = getattr(field, "child", None)  # ListField, ListSerializer
    if child is not None:
        children.append(child)
    for child in children:
        child.parent = None
        _unbind(child)


class _NotPlain(Exception):
    """A value the fast path is not sure about: the serializer decides."""


def _int(value, low: int, high: int | None = None):
    if value is None:
        return None
    if type(value) is not int or value < low or (high is not None and value > high):
        raise _NotPlain
    return value


def _float(value, low: float, high: float, *, above_low: bool = False):
    if value is None:
        return None
    if type(value) not in (int, float) or not (low <= value <= high) or (
            above_low and value == low):
        raise _NotPlain
    return float(value)


def _bool(value):
    if value is not None and type(value) is not bool:
        raise _NotPlain
    return value


def _text(value) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(
            type(part) is dict and part.get("type") == "text" and isinstance(part.get("text"), str)
            for part in value):
        return "".join(part["text"] for part in value)
    raise _NotPlain


_PLAIN_MAX_TOKENS = 2**62  # beyond: the serializer's own limits apply (and word the error)
# The fields plainly_valid checks, with the constraints the serializers above give them. An
# endpoint whose serializer declares any other field goes through the serializer only.
_PLAIN_FIELDS = frozenset({"model", "max_tokens", "temperature", "top_p", "seed", "stop",
                           "stream", "stream_options", "n", "messages", "prompt", "echo",
                           "max_completion_tokens"})


def plainly_valid(kind: "EndpointKind", body: dict) -> dict | None:
    """The serializer's `validated_data` for a body that is plainly valid (the usual request),
    checked in plain Python: DRF builds and deep-copies every field of the serializer per
    request (about a tenth of a short request's CPU in the profile, benchmarks/README.md
    "gateway"). None for anything else, invalid or merely unusual (a model name with
    surrounding spaces, a huge integer, a missing field): `kind.serializer` then decides, so
    every error and its wording stay the serializer's. Keys the serializer does not declare
    have passed `refuse_unsupported` (accepted no-ops) and are ignored, as DRF ignores them.
    tests/platform/test_schemas_fast_path.py holds both paths to the same result."""
    if not _PLAIN_FIELDS.issuperset(kind.serializer._declared_fields):
        return None
    try:
        model = body["model"]
        if not (isinstance(model, str) and 0 < len(model) <= 100 and model.strip() == model
                and model.isprintable()):
            raise _NotPlain
        data = {"model": model,
                "max_tokens": _int(body.get("max_tokens"), 1, _PLAIN_MAX_TOKENS),
                "temperature": _float(body.get("temperature"), 0.0, 2.0),
                "top_p": _float(body.get("top_p"), 0.0, 1.0, above_low=True),
                "seed": _int(body.get("seed"), SEED_MIN, SEED_MAX),
                "stream": _bool(body.get("stream")),
                "n": _int(body.get("n"), 1, 1)}
        stop = body.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        if stop is not None:
            if not (type(stop) is list and len(stop) <= MAX_STOP_SEQUENCES
                    and all(isinstance(s, str) and s for s in stop)):
                raise _NotPlain
            data["stop"] = tuple(stop)
        stream_options = body.get("stream_options")
        if stream_options is not None:
            if type(stream_options) is not dict:
                raise _NotPlain
            include_usage = stream_options.get("include_usage", False)
            if type(include_usage) is not bool:  # null too: the serializer's 400 says why
                raise _NotPlain
            data["stream_options"] = {"include_usage": include_usage}
        if kind.takes_messages:
            messages = body["messages"]
            if type(messages) is not list or not 1 <= len(messages) <= 1024:
                raise _NotPlain
            plain = []
            for message in messages:
                if type(message) is not dict or message.get("role") not in ROLES or not \
                        isinstance(message["role"], str):
                    raise _NotPlain
                plain.append({"role": message["role"], "content": _text(message["content"])})
            data["messages"] = plain
        else:
            prompt = body["prompt"]
            if type(prompt) is list and len(prompt) == 1:
                prompt = prompt[0]
            if not isinstance(prompt, str) or prompt == "" or body.get("echo"):
                raise _NotPlain
            if body.get("echo") is not None and type(body["echo"]) is not bool:
                raise _NotPlain
            data["prompt"] = prompt
        for name in kind.max_tokens_overrides:
            data[name] = _int(body.get(name), 1, _PLAIN_MAX_TOKENS)
    except (_NotPlain, KeyError):
        return None
    return data


def parse_request(kind: "EndpointKind", body: object) -> GenerationRequest:
    """Validate a decoded JSON body for the endpoint `kind`, or raise InvalidRequest (400)."""
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    refuse_unsupported(body, kind.serializer._declared_fields, kind.no_ops, openai=kind.openai)
    data = plainly_valid(kind, body)
    if data is None:  # not plainly valid: the serializer decides, and words the error
        serializer = kind.serializer(data=body)
        try:
            if not serializer.is_valid():
                param, message = _first_error(serializer.errors)
                raise InvalidRequest(f"{param}: {message}" if param else message,
                                     param=param or None)
            data = serializer.validated_data
        finally:
            _unbind(serializer)
    max_tokens = data.get("max_tokens")
    for name in kind.max_tokens_overrides:
        if data.get(name) is not None:
            max_tokens = data[name]
    if max_tokens is None:
        max_tokens = kind.default_max_tokens
    temperature = data.get("temperature")
    if temperature is not None and temperature < GREEDY_TEMPERATURE:
        temperature = 0.0  # greedy: the limit of a tiny temperature (dividing by it overflows)
    top_p = data.get("top_p")
    stream_options = data.get("stream_options") or {}
    messages = None
    if kind.takes_messages:
        messages = tuple({"role": m["role"], "content": m["content"]} for m in data["messages"])
    return GenerationRequest(
        endpoint=kind.name,
        model=data["model"],
        messages=messages,
        prompt=None if kind.takes_messages else data.get("prompt"),
        sampling=Sampling(
            max_tokens=max_tokens,
            temperature=1.0 if temperature is None else float(temperature),
            top_p=1.0 if top_p is None else float(top_p),
            seed=data.get("seed"),
            stop=data.get("stop") or (),
        ),
        stream=bool(data.get("stream")),
        include_usage=bool(stream_options.get("include_usage")),
    )
