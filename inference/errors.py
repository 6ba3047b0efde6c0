"""API errors as OpenAI-style JSON: {"error": {"message", "type", "code"}}.

The openai client maps statuses to its exception types (400 BadRequestError, 401
AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError, 409 ConflictError, 422
UnprocessableEntityError, 429 RateLimitError, 503 InternalServerError after its retries), so
status and body are the contract. docs/api-errors.md lists every code.
"""
from __future__ import annotations

import json

from django.http import JsonResponse


class ApiError(Exception):
    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict:
        error = {"message": self.message, "type": self.type, "code": self.code}
        if self.param is not None:
            error["param"] = self.param
        return {"error": error}

    def to_response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response

    def to_json(self) -> str:
        return json.dumps(self.body())


class InvalidRequest(ApiError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(ApiError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class Forbidden(ApiError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class NotFound(ApiError):
    status = 404
    type = "not_found_error"
    code = "model_not_found"


class MethodNotAllowed(ApiError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class Conflict(ApiError):
    status = 409
    type = "conflict_error"
    code = "idempotency_key_in_use"


class PayloadTooLarge(ApiError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class Unprocessable(ApiError):
    status = 422
    type = "invalid_request_error"
    code = "idempotency_key_reused"


class RateLimited(ApiError):
    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class ServiceUnavailable(ApiError):
    status = 503
    type = "server_error"
    code = "no_replica_available"


class ReplicaFailed(ApiError):
    """The replica failed after retries, or mid-stream; the client may retry."""

    status = 503
    type = "server_error"
    code = "replica_error"


class ReplicaDied(ReplicaFailed):
    """The replica's engine died while serving this request. Not retried on another replica
    (the request may be what killed it); the client may retry later."""


class ModelFailed(ApiError):
    """The model failed on this one request inside a working replica (the others went on).
    Not retried on another replica and not held against the replica."""

    status = 500
    type = "server_error"
    code = "model_error"


class DeadlineExceeded(ApiError):
    """The request ran past settings.REQUEST_DEADLINE_SECONDS; what it held was released."""

    status = 504
    type = "server_error"
    code = "deadline_exceeded"
