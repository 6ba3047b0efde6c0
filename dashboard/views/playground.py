"""The playground: a member sends a prompt and watches the model's answer stream into the page.

The page posts to `stream` (session cookie + CSRF token; no API key ever reaches the page),
which runs the platform's own generation path (`Preparation.prepare_as` -> `Generation`) as the
tenant, through the tenant's internal playground key: quotas, admission, usage and billing
apply exactly as for API calls. The reply is the SSE stream of `/v1/generate`.
"""
from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse
from django.shortcuts import render

from dashboard.access import member_view, membership_of
from dashboard.selectors import playground_models
from inference.container import current_container
from inference.endpoints import GENERATE
from inference.errors import InvalidRequest, MethodNotAllowed, Unauthorized
from inference.faults import as_api_error
from inference.pipeline import decode_body
from inference.relay import open_frames, sse_bytes
from tenants.auth import Principal
from tenants.services import ensure_internal_key

MAX_PLAYGROUND_TOKENS = 512
MAX_PROMPT_CHARS = 8000


@member_view
def playground(request):
    return render(request, "dashboard/playground.html",
                  {"tenant": request.tenant, "models": playground_models(request.tenant.pk),
                   "max_tokens_limit": MAX_PLAYGROUND_TOKENS})


def _principal_for(user) -> Principal | None:
    membership = membership_of(user)
    if membership is None:
        return None
    tenant = membership.tenant
    key = ensure_internal_key(tenant)
    return Principal(tenant_id=tenant.pk, tenant_name=tenant.name, api_key_id=key.pk,
                     key_prefix=key.prefix, priority=tenant.tier.priority,
                     tier_name=tenant.tier.name)


def _generation_body(raw: bytes) -> dict:
    data = decode_body(raw or b"{}")
    if not isinstance(data, dict):
        raise InvalidRequest("The body must be a JSON object.")
    prompt, model = data.get("prompt"), data.get("model")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest("Write a prompt first.", param="prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidRequest(f"The prompt is over {MAX_PROMPT_CHARS} characters.",
                             param="prompt")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("Choose a model.", param="model")
    max_tokens = data.get("max_tokens", 128)
    if (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)
            or not 1 <= max_tokens <= MAX_PLAYGROUND_TOKENS):
        raise InvalidRequest(f"max_tokens must be a whole number from 1 to "
                             f"{MAX_PLAYGROUND_TOKENS}.", param="max_tokens")
    return {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True}


async def stream(request):
    """POST {"model", "prompt", "max_tokens"} -> text/event-stream (`token`... `done`), or an
    OpenAI-style JSON error with its status before any token."""
    try:
        if request.method != "POST":
            raise MethodNotAllowed("Use POST.", headers={"Allow": "POST"})
        user = await request.auser()
        principal = await sync_to_async(_principal_for)(user)
        if principal is None:
            raise Unauthorized("Log in as a member of a tenant.", code="not_logged_in")
        body = _generation_body(request.body)
        container = current_container()
        fmt = GENERATE.response_format
        outcome = await container.preparation.prepare_as(GENERATE, principal, body, None)
        frames = await open_frames(container.generation, outcome, fmt)
    except Exception as exc:  # noqa: BLE001 - Redis/PostgreSQL down: 503 JSON, never a page
        return as_api_error(exc, request.path).to_response()
    response = StreamingHttpResponse(sse_bytes(fmt, frames), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response
