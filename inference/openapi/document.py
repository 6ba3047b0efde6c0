"""build_document(): the OpenAPI 3.1 document of the customer API (served at /v1/openapi.json).

Request bodies come from the serializers that validate them (inference/schemas.py through
fields.py), so the document cannot drift from validation; responses from responses.py. Every
operation lists the error statuses its view can answer, each with the one error body.
"""
from __future__ import annotations

import functools

from inference import schemas
from inference.openapi import responses as r
from inference.openapi.fields import serializer_schema

OPENAPI_VERSION = "3.1.0"

_ERROR_STATUSES = {
    "400": "Invalid request (body, parameter or context length).",
    "401": "Missing or invalid API key.",
    "404": "Unknown model, or one the key's tenant may not use.",
    "405": "Method not allowed.",
    "409": "The Idempotency-Key is in use by a request still running.",
    "413": "Request body too large.",
    "422": "The Idempotency-Key was used with a different body.",
    "429": "Rate limit reached (type `requests` or `tokens`); see Retry-After.",
    "500": "The model failed on this request.",
    "503": "No capacity (no replica ready, queue full, wait bound passed, replica failed); "
           "see Retry-After.",
}
_READ_ERRORS = ("400", "401", "404", "405", "429", "503")
_GENERATION_ERRORS = tuple(_ERROR_STATUSES)


def _errors(statuses) -> dict:
    return {status: {"description": _ERROR_STATUSES[status],
                     "content": {"application/json": {
                         "schema": {"$ref": "#/components/schemas/Error"}}}}
            for status in statuses}


_HEADERS = {
    "X-Request-Id": {"description": "The request's id (the client's, when well formed and "
                                    "unused, else a new one).", "schema": {"type": "string"}},
}
_REQUEST_ID_PARAM = {"name": "X-Request-Id", "in": "header", "required": False,
                     "schema": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$"},
                     "description": "Kept as the request's id when well formed and unused."}
_IDEMPOTENCY_PARAM = {"name": "Idempotency-Key", "in": "header", "required": False,
                      "schema": {"type": "string", "minLength": 1, "maxLength": 255}}


def _generation(summary: str, serializer, reply_ref: str, stream_note: str) -> dict:
    return {"post": {
        "summary": summary,
        "parameters": [_REQUEST_ID_PARAM, _IDEMPOTENCY_PARAM],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{serializer}"}}}},
        "responses": {
            "200": {"description": f"The reply; with `stream: true`, {stream_note}",
                    "headers": _HEADERS,
                    "content": {"application/json": {
                                    "schema": {"$ref": f"#/components/schemas/{reply_ref}"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            **_errors(_GENERATION_ERRORS),
        },
    }}


def _get(summary: str, schema: dict, errors=_READ_ERRORS, parameters=(), secured=True) -> dict:
    operation = {"summary": summary, "parameters": [_REQUEST_ID_PARAM, *parameters],
                 "responses": {"200": {"description": "OK", "headers": _HEADERS,
                                       "content": {"application/json": {"schema": schema}}},
                               **_errors(errors)}}
    if not secured:
        operation["security"] = []
    return {"get": operation}


@functools.cache
def build_document() -> dict:
    usage_params = [
        {"name": "start", "in": "query", "required": True,
         "schema": {"type": "string", "format": "date-time"},
         "description": "ISO 8601 date or time (UTC when no offset)."},
        {"name": "end", "in": "query", "required": True,
         "schema": {"type": "string", "format": "date-time"}},
        {"name": "granularity", "in": "query", "required": False,
         "schema": {"enum": ["hour", "day"], "default": "hour"}},
    ]
    model_id = [{"name": "model_id", "in": "path", "required": True,
                 "schema": {"type": "string", "minLength": 1}}]
    return {
        "openapi": OPENAPI_VERSION,
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": {"title": "LLM platform API", "version": "1",
                 "description": "Native and OpenAI-compatible generation, the model catalogue "
                                "and the tenant's usage. Errors are OpenAI-style JSON."},
        "servers": [{"url": "/"}],
        "security": [{"bearerAuth": []}],
        "paths": {
            "/v1/generate": _generation(
                "Generate from chat messages (native format)", "GenerateRequest",
                "Generation", "SSE events `token` ({text}), then `done` (id, model, "
                "finish_reason, usage) or `error` (an error body)."),
            "/v1/chat/completions": _generation(
                "OpenAI chat completions", "ChatCompletionRequest", "ChatCompletion",
                "OpenAI `chat.completion.chunk` SSE events, then `data: [DONE]`."),
            "/v1/completions": _generation(
                "OpenAI (legacy) completions", "CompletionRequest", "Completion",
                "OpenAI `text_completion` SSE events, then `data: [DONE]`."),
            "/v1/models": _get("Models the key's tenant may use", {
                "$ref": "#/components/schemas/ModelList"}, errors=("401", "405", "429", "503")),
            "/v1/models/{model_id}": _get("One model", {"$ref": "#/components/schemas/Model"},
                                          errors=("401", "404", "405", "429", "503"),
                                          parameters=model_id),
            "/v1/usage": _get("The tenant's usage by hour or day",
                              {"$ref": "#/components/schemas/Usage"},
                              errors=("400", "401", "405", "429", "503"),
                              parameters=usage_params),
            "/health": _get("Liveness (no dependency checked)", r.HEALTH, errors=("405",),
                            secured=False),
            "/healthz": _get("Liveness (same as /health)", r.HEALTH, errors=("405",),
                             secured=False),
            "/readyz": {"get": {
                "summary": "Readiness: database, Redis, a ready replica", "security": [],
                "responses": {
                    "200": {"description": "Ready", "content": {"application/json": {
                        "schema": r.READY}}},
                    "503": {"description": "Not ready", "content": {"application/json": {
                        "schema": {"anyOf": [r.READY, {"$ref": "#/components/schemas/Error"}]}}}},
                    **_errors(("405",))}}},
        },
        "components": {
            "securitySchemes": {"bearerAuth": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "GenerateRequest": serializer_schema(schemas.GenerateSerializer),
                "ChatCompletionRequest": serializer_schema(schemas.ChatSerializer),
                "CompletionRequest": serializer_schema(schemas.CompletionsSerializer),
                "Generation": r.GENERATION,
                "ChatCompletion": r.CHAT_COMPLETION,
                "Completion": r.COMPLETION,
                "Model": r.MODEL,
                "ModelList": r.MODEL_LIST,
                "Usage": r.USAGE,
                "Error": r.ERROR,
            },
        },
    }
