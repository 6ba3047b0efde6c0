"""Response schemas: the shapes inference/formats and the catalog/usage views return.

Invariant: each mirrors one renderer (named beside it); tests/platform/test_openapi.py checks
real replies against them, and the schemathesis run checks every reply it provokes.
"""
from __future__ import annotations

NULLABLE_STRING = {"type": ["string", "null"]}

# inference/errors.py ApiError.body()
ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"],
        "properties": {
            "message": {"type": "string"},
            "type": {"enum": ["invalid_request_error", "requests", "tokens", "server_error"]},
            "param": NULLABLE_STRING,
            "code": {"type": "string"},
            "request_id": {"type": "string"},
        }}},
}

_OPENAI_USAGE = {
    "type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
    "properties": {
        "prompt_tokens": {"type": "integer", "minimum": 0},
        "completion_tokens": {"type": "integer", "minimum": 0},
        "total_tokens": {"type": "integer", "minimum": 0},
        "prompt_tokens_details": {"type": "object", "properties": {
            "cached_tokens": {"type": "integer", "minimum": 0}}},
    },
}
OPENAI_FINISH_REASONS = ["stop", "length"]

# inference/formats/native.py NativeFormat.complete
GENERATION = {
    "type": "object",
    "required": ["id", "object", "created", "model", "text", "finish_reason", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "generation"},
        "created": {"type": "integer"}, "model": {"type": "string"}, "text": {"type": "string"},
        "finish_reason": {"type": "string"},
        "usage": {"type": "object", "required": ["input_tokens", "output_tokens"],
                  "properties": {"input_tokens": {"type": "integer", "minimum": 0},
                                 "output_tokens": {"type": "integer", "minimum": 0}}},
    },
}

# inference/formats/openai.py ChatFormat.complete
CHAT_COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "chat.completion"},
        "created": {"type": "integer"}, "model": {"type": "string"},
        "choices": {"type": "array", "items": {
            "type": "object", "required": ["index", "message", "finish_reason"],
            "properties": {
                "index": {"type": "integer"},
                "message": {"type": "object", "required": ["role", "content"],
                            "properties": {"role": {"const": "assistant"},
                                           "content": {"type": "string"}}},
                "logprobs": {"type": "null"},
                "finish_reason": {"enum": OPENAI_FINISH_REASONS},
            }}},
        "usage": _OPENAI_USAGE,
    },
}

# inference/formats/openai.py CompletionsFormat.complete
COMPLETION = {
    "type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
    "properties": {
        "id": {"type": "string"}, "object": {"const": "text_completion"},
        "created": {"type": "integer"}, "model": {"type": "string"},
        "choices": {"type": "array", "items": {
            "type": "object", "required": ["index", "text", "finish_reason"],
            "properties": {"index": {"type": "integer"}, "text": {"type": "string"},
                           "logprobs": {"type": "null"},
                           "finish_reason": {"enum": OPENAI_FINISH_REASONS}}}},
        "usage": _OPENAI_USAGE,
    },
}

# models_registry.selectors.models_for_tenant
MODEL = {
    "type": "object", "required": ["id", "object", "created", "owned_by"],
    "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                   "created": {"type": "integer"}, "owned_by": {"type": "string"}},
}
MODEL_LIST = {
    "type": "object", "required": ["object", "data"],
    "properties": {"object": {"const": "list"},
                   "data": {"type": "array", "items": {"$ref": "#/components/schemas/Model"}}},
}

# billing/views.py usage_view (rows: billing.selectors.usage_series)
USAGE = {
    "type": "object", "required": ["object", "granularity", "start", "end", "data"],
    "properties": {
        "object": {"const": "list"}, "granularity": {"enum": ["hour", "day"]},
        "start": {"type": "string"}, "end": {"type": "string"},
        "data": {"type": "array", "items": {"type": "object"}},
    },
}

# inference/views/catalog.py
HEALTH = {"type": "object", "required": ["status"],
          "properties": {"status": {"const": "ok"}, "pid": {"type": "integer"}}}
READY = {
    "type": "object", "required": ["status", "checks"],
    "properties": {"status": {"enum": ["ready", "not_ready"]},
                   "checks": {"type": "object",
                              "additionalProperties": {"type": "boolean"}}},
}
