"""Everything before the router: authenticate, validate, resolve the model, tokenize, claim
the Idempotency-Key. Shared by the HTTP views and the WebSocket consumer."""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace

from asgiref.sync import sync_to_async
from django.conf import settings

from inference.canary import choose_version, sticky_key
from inference.container import Container
from inference.errors import (
    InvalidRequest,
    RateLimited,
    NotFound,
    ServiceUnavailable,
    Unauthorized,
)
from inference.idempotency import Claim, Replay, fingerprint, validate_key
from inference.json_body import decode_json
from inference.key_ratelimit import KeyRate, count_alone, key_rate
from inference.observability.request_ids import request_id_for_usage
from inference.quota import Charge, admit, current_headers
from inference.schemas import GenerationRequest, parse_request
from inference.fallbacks import FAILED, UNAVAILABLE
from models_registry.selectors import ServingVersion
from llm_platform.logging import bind_request_context
from tenants.auth import AuthenticationFailed, Principal, bearer_token

logger = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
# Prompts longer than this are tokenized off the event loop.
INLINE_TOKENIZE_CHARS = 4096


@dataclass(frozen=True)
class Prepared:
    request_id: str
    principal: Principal
    target: ServingVersion
    request: GenerationRequest
    prompt_text: str
    prompt_token_ids: tuple[int, ...]
    max_tokens: int
    claim: Claim | None  # None: no Idempotency-Key
    charge: Charge  # what the tenant's buckets were charged (corrected when the request ends)
    # Canary rollouts: `target` is the canary; `fallback` (stable) serves the request if no
    # canary replica can (see generation.py). None: `target` is the only version to try.
    fallback: ServingVersion | None = None
    rollout_id: int | None = None

    @property
    def quota_headers(self) -> dict[str, str]:
        return self.charge.headers


@dataclass(frozen=True)
class Replayed:
    request: GenerationRequest
    result: dict
    quota_headers: dict[str, str]  # the buckets as they are: a replay charges nothing


async def authenticate_header(container: Container, authorization: str | None) -> Principal:
    token = bearer_token(authorization)
    if token is None:
        raise Unauthorized("Missing API key: send 'Authorization: Bearer <key>'.",
                           code="missing_api_key")
    try:
        return await container.auth.authenticate(token)
    except AuthenticationFailed as exc:
        raise Unauthorized(str(exc)) from exc


def decode_body(raw_body: bytes) -> object:
    """The body as JSON with json_body's invariants (bounded, finite, valid Unicode)."""
    return decode_json(raw_body, settings.API_MAX_BODY_BYTES)


async def _tokenize(container: Container, target: ServingVersion, request: GenerationRequest):
    try:
        tokenizer = await container.tokenizers.aget(target.tokenizer, target.weights_uri)
    except (OSError, ImportError, ValueError, KeyError) as exc:
        logger.exception("cannot load the tokenizer of %s", target.model_name)
        raise ServiceUnavailable(f"The model '{target.model_name}' is not available right now.",
                                 code="model_unavailable",
                                 headers={"Retry-After": "30"}) from exc

    def render_and_encode() -> tuple[str, list[int]]:
        if request.messages is None:
            return request.prompt, tokenizer.encode(request.prompt)
        messages = list(request.messages)
        try:
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            return text, tokenizer.encode_chat(messages, add_generation_prompt=True)
        except ValueError as exc:  # the model's template rejects these messages
            raise InvalidRequest(f"messages: {exc}", param="messages") from exc

    size = sum(len(m["content"]) for m in request.messages) if request.messages else len(request.prompt)
    if size <= INLINE_TOKENIZE_CHARS:
        return render_and_encode()
    return await sync_to_async(render_and_encode, thread_sensitive=False)()


def _max_tokens(request: GenerationRequest, num_prompt_tokens: int, context_length: int) -> int:
    room = context_length - num_prompt_tokens
    asked = request.sampling.max_tokens
    if asked is None:
        if room < 1:
            raise InvalidRequest(
                f"The prompt has {num_prompt_tokens} tokens; the context window is "
                f"{context_length}.", code="context_length_exceeded", param="messages")
        return min(DEFAULT_MAX_TOKENS, room)
    if num_prompt_tokens + asked > context_length:
        raise InvalidRequest(
            f"The prompt ({num_prompt_tokens} tokens) plus max_tokens ({asked}) exceeds the "
            f"model's context window of {context_length} tokens.",
            code="context_length_exceeded", param="max_tokens")
    return asked


async def quota_headers_for(container: Container, authorization: str | None) -> dict[str, str]:
    """The x-ratelimit-* headers for a refusal raised before the bucket check: the tenant's
    buckets as they are, nothing charged. Empty when the key does not authenticate (or Redis
    fails: the refusal itself must still go out)."""
    async def lookup() -> dict[str, str]:
        principal = await authenticate_header(container, authorization)
        limits = await container.limits.get(principal.tenant_id)
        return await current_headers(container.buckets, limits)

    try:  # bounded: a slow dependency must not hold the refusal
        return await asyncio.wait_for(lookup(), settings.CLEANUP_STEP_TIMEOUT_SECONDS)
    except Exception:  # noqa: BLE001 - headers are best effort on an error reply
        return {}


async def record_fallback(container: Container, rollout_id: int, reason: str) -> None:
    try:
        await container.fallbacks.record(rollout_id, reason)
    except Exception:  # noqa: BLE001 - bookkeeping of the canary; the request goes on
        logger.exception("canary fallback of rollout %s not counted", rollout_id)


async def _choose_version(container: Container, stable: ServingVersion, principal: Principal,
                          request: GenerationRequest, conversation_id: str | None,
                          idempotency_key: str | None):
    """The live rollout's split; a canary without a ready replica sends the request to stable
    at once (counted as an `unavailable` fallback, not an error of the canary)."""
    rollout = await container.rollouts.get(stable.model_name)
    choice = choose_version(stable, rollout, principal.tenant_id,
                            sticky_key(request, conversation_id, idempotency_key))
    if choice.fallback is not None and await container.router.num_ready(
            choice.target.model_version_id) == 0:
        await record_fallback(container, choice.rollout_id, UNAVAILABLE)
        return stable, None, None
    return choice.target, choice.fallback, choice.rollout_id


async def retarget(container: Container, prepared: Prepared) -> Prepared:
    """The same request on its fallback (stable) version: tokenized again when the tokenizer
    differs, max_tokens capped to the fallback's context window."""
    target = prepared.fallback
    if target is None:
        raise ValueError("this request has no fallback version")
    prompt_text, prompt_ids = prepared.prompt_text, list(prepared.prompt_token_ids)
    if (target.tokenizer, target.weights_uri) != (prepared.target.tokenizer,
                                                  prepared.target.weights_uri):
        prompt_text, prompt_ids = await _tokenize(container, target, prepared.request)
    room = target.context_length - len(prompt_ids)
    if room < 1:
        raise InvalidRequest(f"The prompt has {len(prompt_ids)} tokens; the context window is "
                             f"{target.context_length}.", code="context_length_exceeded",
                             param="messages")
    return replace(prepared, target=target, fallback=None, prompt_text=prompt_text,
                   prompt_token_ids=tuple(prompt_ids), max_tokens=min(prepared.max_tokens, room))


async def prepare(container: Container, endpoint: str, authorization: str | None,
                  body: object, idempotency_key: str | None,
                  conversation_id: str | None = None) -> Prepared | Replayed:
    """Raises ApiError subclasses for every refusal (401, 400, 404, 409, 422, 429).
    `conversation_id` (the X-Conversation-Id header) keeps a conversation on one version
    while a canary rollout runs. Counts the request against its key's rate (HTTP and
    WebSocket alike: in the buckets' own call, else on its own, inference/key_ratelimit.py)."""
    principal = await authenticate_header(container, authorization)
    return await prepare_for_key(container, endpoint, principal, body, idempotency_key,
                                 conversation_id)


async def prepare_for_key(container: Container, endpoint: str, principal: Principal,
                          body: object, idempotency_key: str | None,
                          conversation_id: str | None = None) -> Prepared | Replayed:
    """`prepare_as` for a principal authenticated by its API key: the request counts against
    the key's rate (inference/key_ratelimit.py)."""
    rate = key_rate(container.key_prefix, principal.api_key_id)
    try:
        outcome = await prepare_as(container, endpoint, principal, body, idempotency_key,
                                   conversation_id, key_rate=rate)
    except Exception:
        if rate is not None and not rate.counted:
            try:
                await count_alone(container.redis, rate)  # over the rate: its 429 comes first
            except RateLimited:
                raise
            except Exception:  # noqa: BLE001 - Redis trouble: the request's own error stands
                pass
        raise
    if rate is not None and not rate.counted:  # a replay
        await count_alone(container.redis, rate)
    return outcome


async def prepare_as(container: Container, endpoint: str, principal: Principal,
                     body: object, idempotency_key: str | None,
                     conversation_id: str | None = None,
                     key_rate: KeyRate | None = None) -> Prepared | Replayed:
    """`prepare` for a principal already authenticated some other way (the dashboard's
    playground: a logged-in member of the tenant). Same refusals, minus the 401s.
    `key_rate`: counted with the buckets when the request gets that far."""
    request = parse_request(endpoint, body)
    bind_request_context(tenant_id=principal.tenant_id, model=request.model)
    stable = await container.catalog.get(request.model, principal.tenant_id)
    if stable is None:
        raise NotFound(f"The model '{request.model}' does not exist or you do not have access "
                       "to it.", param="model")
    target, fallback, rollout_id = await _choose_version(
        container, stable, principal, request, conversation_id, idempotency_key)
    try:
        prompt_text, prompt_ids = await _tokenize(container, target, request)
    except ServiceUnavailable:
        if fallback is None:
            raise
        # The canary's tokenizer cannot load: a broken canary, not the customer's problem.
        await record_fallback(container, rollout_id, FAILED)
        target, fallback, rollout_id = fallback, None, None
        prompt_text, prompt_ids = await _tokenize(container, target, request)
    max_tokens = _max_tokens(request, len(prompt_ids), target.context_length)
    claim = None
    if idempotency_key is not None:
        outcome = await container.idempotency.begin(
            principal.tenant_id, validate_key(idempotency_key), fingerprint(endpoint, body))
        if isinstance(outcome, Replay):
            limits = await container.limits.get(principal.tenant_id)
            return Replayed(request=request, result=outcome.result,
                            quota_headers=await current_headers(container.buckets, limits))
        claim = outcome
    try:
        limits = await container.limits.get(principal.tenant_id)
        charge = await admit(container.buckets, limits, len(prompt_ids), max_tokens, key_rate)
    except BaseException:  # refused (429/400) or broken: the client may retry with the key
        if claim is not None:
            await asyncio.shield(container.idempotency.abandon(claim))
        raise
    return Prepared(
        request_id=request_id_for_usage(),
        principal=principal,
        target=target,
        request=request,
        prompt_text=prompt_text,
        prompt_token_ids=tuple(prompt_ids),
        max_tokens=max_tokens,
        claim=claim,
        charge=charge,
        fallback=fallback,
        rollout_id=rollout_id,
    )
