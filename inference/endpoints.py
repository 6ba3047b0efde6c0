"""One record per endpoint kind: everything that differs between /v1/generate,
/v1/chat/completions and /v1/completions, in one place.

The view (or the WebSocket consumer, or the dashboard's playground) picks its `EndpointKind`;
the steps below read what they need from it (the serializer and the accepted no-op parameters
in `schemas.parse_request`, the default max_tokens, the response format in the relay) instead
of dispatching on the endpoint's name. To add an endpoint: a serializer in `schemas.py`, a
response format in `formats/`, one `EndpointKind` here, the view and its route.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from rest_framework import serializers

from inference.formats.base import ResponseFormat
from inference.formats.native import NativeFormat
from inference.formats.openai import ChatFormat, CompletionsFormat
from inference.schemas import ChatSerializer, CompletionsSerializer, GenerateSerializer
from inference.unsupported_params import NO_OPS, NoOp


@dataclass(frozen=True)
class EndpointKind:
    name: str  # "generate" | "chat" | "completions": usage rows, metrics, Idempotency-Keys
    serializer: type[serializers.Serializer]
    response_format: ResponseFormat  # stateless: one instance serves every request
    openai: bool  # OpenAI's parameter conventions (no-op parameters, stream_options)
    takes_messages: bool  # chat-style `messages`, else a `prompt`
    # max_tokens when the body has none, applied as if asked (OpenAI's 16 for the legacy
    # completions endpoint); None: the rest of the context window, up to
    # pipeline.DEFAULT_MAX_TOKENS.
    default_max_tokens: int | None = None
    # Body fields that override `max_tokens` when given (chat's `max_completion_tokens`).
    max_tokens_overrides: tuple[str, ...] = ()
    no_ops: dict[str, NoOp] = field(default_factory=dict)


GENERATE = EndpointKind("generate", GenerateSerializer, NativeFormat(), openai=False,
                        takes_messages=True, no_ops=NO_OPS["generate"])
CHAT = EndpointKind("chat", ChatSerializer, ChatFormat(), openai=True, takes_messages=True,
                    max_tokens_overrides=("max_completion_tokens",), no_ops=NO_OPS["chat"])
COMPLETIONS = EndpointKind("completions", CompletionsSerializer, CompletionsFormat(),
                           openai=True, takes_messages=False, default_max_tokens=16,
                           no_ops=NO_OPS["completions"])

ENDPOINTS: dict[str, EndpointKind] = {kind.name: kind for kind in (GENERATE, CHAT, COMPLETIONS)}
