"""Error plumbing for the JSON API views: every refusal is OpenAI-style JSON."""
from __future__ import annotations

import functools
import logging

from django.core.exceptions import RequestDataTooBig
from django.views.decorators.csrf import csrf_exempt

from inference.errors import ApiError, MethodNotAllowed, NotFound, PayloadTooLarge
from inference.faults import as_api_error
from llm_platform.db_watchdog import query_timeout
from llm_platform.hot_settings import settings

logger = logging.getLogger(__name__)


def api_endpoint(*methods: str):
    """Decorate an async view: CSRF-exempt (key-authenticated API), method check, and
    ApiError -> JSON response. Redis or PostgreSQL unavailable -> 503 with Retry-After
    (inference/faults.py); anything unexpected is logged and answered as JSON too."""

    def decorator(view):
        @csrf_exempt
        @functools.wraps(view)
        async def wrapper(request, *args, **kwargs):
            try:
                if request.method not in methods:
                    raise MethodNotAllowed(f"Method {request.method} is not allowed here.",
                                           headers={"Allow": ", ".join(methods)})
                # PostgreSQL has no read timeout: bound this request's queries.
                with query_timeout(settings.DB_QUERY_TIMEOUT_SECONDS):
                    return await view(request, *args, **kwargs)
            except ApiError as exc:
                return exc.to_response()
            except RequestDataTooBig:
                return PayloadTooLarge("The request body is too large.").to_response()
            except Exception as exc:  # noqa: BLE001 - Redis/PostgreSQL down: 503; else 500 JSON
                return as_api_error(exc, request.path).to_response()

        return wrapper

    return decorator


def json_not_found(request, exception=None):
    return NotFound(f"No route for {request.path}.", code="not_found").to_response()
