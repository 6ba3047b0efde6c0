"""Preparing a request: everything before admission, one pass top to bottom.

    authenticate the key -> count it against the key's rate -> parse the body (the endpoint
    kind's serializer) -> resolve the serving version -> stable or canary, and the prompt as
    that version encodes it -> max_tokens -> claim the Idempotency-Key -> charge the
    tenant's token buckets

`Preparation.prepare` returns a `PreparedRequest` (or `Replayed`: the key's stored reply) and
raises ApiError subclasses for every refusal (401, 400, 404, 409, 413, 422, 429). Every refusal
of an authenticated request carries the tenant's x-ratelimit-* headers: the key is
authenticated once, and the same principal names the buckets to report. Shared by the HTTP
views, the WebSocket consumer and the dashboard's playground; knows nothing of what comes
after it (inference/generation.py).
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Callable

from inference.canary import VersionChooser, sticky_key
from inference.endpoints import EndpointKind
from inference.errors import ApiError, NotFound, PayloadTooLarge, RateLimited, Unauthorized
from inference.idempotency import IdempotencyStore, Replay, fingerprint, validate_key
from inference.json_body import decode_json
from inference.key_ratelimit import KeyRate, count_alone, key_rate
from inference.observability.request_ids import request_id_for_usage
from inference.prompts import max_tokens_for
from inference.quota import admit, current_headers
from inference.request import PreparedRequest, Replayed
from inference.router import ServingCatalog
from inference.schemas import parse_request
from llm_platform.hot_settings import settings
from llm_platform.logging import bind_request_context
from tenants.auth import AuthenticationFailed, KeyAuthenticator, Principal, bearer_token
from tenants.buckets import TokenBuckets
from tenants.selectors import LimitsCache

logger = logging.getLogger(__name__)

QUOTA_HEADER = "x-ratelimit-limit-requests"


def decode_body(raw_body: bytes) -> object:
    """The body as JSON with json_body's invariants (bounded, finite, valid Unicode)."""
    return decode_json(raw_body, settings.API_MAX_BODY_BYTES)


@dataclass(frozen=True)
class Submission:
    """What an HTTP request brings to `prepare`: its headers and a way to read its body (read
    only once the declared length is known to fit)."""

    authorization: str | None
    idempotency_key: str | None
    conversation_id: str | None  # X-Conversation-Id: one conversation, one version
    declared_length: int  # Content-Length (0 when absent or unreadable)
    read_body: Callable[[], bytes]


class Preparation:
    def __init__(self, *, auth: KeyAuthenticator, redis, key_prefix: str,
                 catalog: ServingCatalog, versions: VersionChooser,
                 idempotency: IdempotencyStore, limits: LimitsCache, buckets: TokenBuckets):
        self._auth = auth
        self._redis = redis  # the key's rate when it is counted on its own
        self._key_prefix = key_prefix
        self._catalog = catalog
        self._versions = versions
        self._idempotency = idempotency
        self._limits = limits
        self._buckets = buckets

    async def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an `Authorization: Bearer <key>` header, or 401."""
        token = bearer_token(authorization)
        if token is None:
            raise Unauthorized("Missing API key: send 'Authorization: Bearer <key>'.",
                               code="missing_api_key")
        try:
            return await self._auth.authenticate(token)
        except AuthenticationFailed as exc:
            raise Unauthorized(str(exc)) from exc

    async def prepare(self, kind: EndpointKind,
                      submission: Submission) -> PreparedRequest | Replayed:
        """An HTTP request, from its headers and body."""
        principal = await self.authenticate(submission.authorization)
        try:
            if submission.declared_length > settings.API_MAX_BODY_BYTES:
                raise PayloadTooLarge(
                    f"The request body exceeds {settings.API_MAX_BODY_BYTES} bytes.")
            return await self.prepare_for_key(kind, principal,
                                              decode_body(submission.read_body()),
                                              submission.idempotency_key,
                                              submission.conversation_id)
        except ApiError as exc:
            await self._add_quota_headers(exc, principal)
            raise

    async def prepare_for_key(self, kind: EndpointKind, principal: Principal, body: object,
                              idempotency_key: str | None,
                              conversation_id: str | None = None) -> PreparedRequest | Replayed:
        """`prepare_as` for a principal authenticated by its API key (HTTP and WebSocket
        alike): the request counts against the key's rate, in the buckets' own call, else on
        its own (inference/key_ratelimit.py)."""
        rate = key_rate(self._key_prefix, principal.api_key_id)
        try:
            outcome = await self.prepare_as(kind, principal, body, idempotency_key,
                                            conversation_id, key_rate=rate)
        except Exception:
            if rate is not None and not rate.counted:
                try:
                    await count_alone(self._redis, rate)  # over the rate: its 429 comes first
                except RateLimited:
                    raise
                except Exception:  # noqa: BLE001 - Redis trouble: the request's own error stands
                    pass
            raise
        if rate is not None and not rate.counted:  # a replay
            await count_alone(self._redis, rate)
        return outcome

    async def prepare_as(self, kind: EndpointKind, principal: Principal, body: object,
                         idempotency_key: str | None, conversation_id: str | None = None,
                         key_rate: KeyRate | None = None) -> PreparedRequest | Replayed:
        """A decoded body for a principal already authenticated (by `prepare_for_key`, or the
        dashboard's login for its playground). `conversation_id` keeps a conversation on one
        version while a canary rollout runs; `key_rate`: counted with the buckets when the
        request gets that far."""
        request = parse_request(kind, body)
        bind_request_context(tenant_id=principal.tenant_id, model=request.model)
        stable = await self._catalog.get(request.model, principal.tenant_id)
        if stable is None:
            raise NotFound(f"The model '{request.model}' does not exist or you do not have "
                           "access to it.", param="model")
        choice, prompt = await self._versions.choose(
            stable, principal.tenant_id,
            lambda: sticky_key(request, conversation_id, idempotency_key), request)
        target = choice.target
        max_tokens = max_tokens_for(request, len(prompt.token_ids), target.context_length)
        limits = await self._limits.get(principal.tenant_id)
        claim = None
        if idempotency_key is not None:
            outcome = await self._idempotency.begin(
                principal.tenant_id, validate_key(idempotency_key), fingerprint(kind.name, body))
            if isinstance(outcome, Replay):
                return Replayed(request=request, result=outcome.result,
                                quota_headers=await current_headers(self._buckets, limits))
            claim = outcome
        try:
            charge = await admit(self._buckets, limits, len(prompt.token_ids), max_tokens,
                                 key_rate)
        except BaseException:  # refused (429/400) or broken: the client may retry with the key
            if claim is not None:
                await asyncio.shield(self._idempotency.abandon(claim))
            raise
        return PreparedRequest(
            request_id=request_id_for_usage(),
            principal=principal,
            target=target,
            request=request,
            prompt_text=prompt.text,
            prompt_token_ids=prompt.token_ids,
            max_tokens=max_tokens,
            claim=claim,
            charge=charge,
            fallback=choice.fallback,
            rollout_id=choice.rollout_id,
        )

    async def _add_quota_headers(self, exc: ApiError, principal: Principal) -> None:
        """A refusal before the bucket check (400, 404, 409, 413, 422, the key's 429) reports
        the tenant's buckets as they are, nothing charged. Bounded and best effort: a slow or
        failing Redis must not hold or change the refusal itself."""
        if QUOTA_HEADER in exc.headers:  # the bucket check's own 429
            return

        async def lookup() -> dict[str, str]:
            limits = await self._limits.get(principal.tenant_id)
            return await current_headers(self._buckets, limits)

        try:
            headers = await asyncio.wait_for(lookup(), settings.CLEANUP_STEP_TIMEOUT_SECONDS)
        except Exception:  # noqa: BLE001 - headers are best effort on an error reply
            return
        exc.headers = {**headers, **exc.headers}
