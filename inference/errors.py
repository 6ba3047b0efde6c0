"""API errors as OpenAI-style JSON: {"error": {"message", "type", "code"}}.

The openai client maps statuses to its exception types (400 BadRequestError, 401
AuthenticationError, 403 PermissionDeniedError, 404 NotFoundError, 409 ConflictError, 422
UnprocessableEntityError, 429 RateLimitError, 503 InternalServerError after its retries), so
status and body are the contract. docs/api-errors.md lists every code.

`type` takes OpenAI's values only: `invalid_request_error` (every 4xx but 429), `requests` or
`tokens` (429: which limit), `server_error` (5xx). `param` is always present (null when none);
`request_id` is the request's id (the X-Request-Id header), when there is one.
"""
from __future__ import annotations

from django.http import JsonResponse

from inference.observability.request_ids import current_request_id


class ApiError(Exception):
    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, message: str, *, code: str | None = None, param: str | None = None,
                 headers: dict[str, str] | None = None, error_type: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if error_type is not None:
            self.type = error_type
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict:
        error = {"message": self.message, "type": self.type, "param": self.param,
                 "code": self.code}
        request_id = current_request_id()
        if request_id is not None:
            error["request_id"] = request_id
        return {"error": error}

    def to_response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        response.error_code = self.code  # the refusal reason in the platform's metrics
        for name, value in self.headers.items():
            response[name] = value
        return response


class InvalidRequest(ApiError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class Unauthorized(ApiError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class Forbidden(ApiError):
    status = 403
    type = "invalid_request_error"
    code = "forbidden"


class NotFound(ApiError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class MethodNotAllowed(ApiError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class Conflict(ApiError):
    status = 409
    type = "invalid_request_error"
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
    type = "requests"  # or "tokens": the limit reached (OpenAI's values)
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
