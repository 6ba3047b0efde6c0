"""The rollout's part of the request path: which version (stable or canary) serves a request.

Sticky key, first that applies (README, "Canary rollouts"):
1. the `X-Conversation-Id` header (WebSocket: `"conversation_id"`): the client names it;
2. chat endpoints: the conversation's opening, i.e. the messages up to and including the first
   user message: every later turn of a conversation resends them, so it stays on one version
   without the client doing anything;
3. the Idempotency-Key (its retries are the same request);
4. the prompt of /v1/completions.
The key is hashed with the tenant and the rollout id (inference/canary_split.py).

The rollout itself is read through `inference.hooks.rollout_source` (rollouts connects it):
the request path does not import the rollouts app.

Falling back to stable lives here, in `VersionChooser`, and nowhere else: a canary request
goes to stable when no canary replica is ready (`unavailable`), when the canary's tokenizer
cannot load (`failed`), and when the canary cannot start it (every canary replica failed
before the first token: `failed`; its queue was full or no replica became ready:
`unavailable`). A canary that has streamed a token is never left: its failure is the
request's. Each fallback is counted for the evaluator (inference/fallbacks.py).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, replace
from typing import Awaitable, Callable

from common.ttl_cache import TtlCache
from inference.canary_split import to_canary
from inference.db_connection import registry_cache
from inference.errors import InvalidRequest, ServiceUnavailable
from inference.fallbacks import FAILED, UNAVAILABLE, FallbackRecorder
from inference.prompts import PromptEncoder
from inference.request import PreparedRequest, Prompt
from inference.schemas import GenerationRequest
from models_registry.selectors import ServingVersion

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveRollout:
    """A model's running or paused rollout, as the request path needs it."""

    rollout_id: int
    percent: float  # 0..100 of the model's traffic goes to `canary`
    stable_version_id: int
    canary: ServingVersion


def sticky_key(request: GenerationRequest, conversation_id: str | None,
               idempotency_key: str | None) -> str:
    if conversation_id:
        return "conversation:" + conversation_id
    if request.messages:
        opening = []
        for message in request.messages:
            opening.append([message.get("role"), message.get("content")])
            if message.get("role") == "user":
                break
        return "opening:" + json.dumps(opening, ensure_ascii=False, separators=(",", ":"))
    if idempotency_key:
        return "idempotency:" + idempotency_key
    return "prompt:" + (request.prompt or "")


@dataclass(frozen=True)
class VersionChoice:
    target: ServingVersion
    fallback: ServingVersion | None  # stable, when `target` is the canary
    rollout_id: int | None


class RolloutCatalog:
    """`read(model_name)` per model, at most every `ttl_seconds` (`read` is
    `inference.hooks.rollout_source` in production); reloaded ahead
    (inference.db_connection.registry_cache)."""

    def __init__(self, clock: Callable[[], float], ttl_seconds: float,
                 read: Callable[[str], Awaitable[LiveRollout | None]]):
        self._cache: TtlCache[str, LiveRollout | None] = registry_cache(read, clock,
                                                                          ttl_seconds)

    async def get(self, model_name: str) -> LiveRollout | None:
        return await self._cache.get(model_name)


def choose_version(stable: ServingVersion, rollout: LiveRollout | None, tenant_id: int,
                   key: str) -> VersionChoice:
    """Stable unless the rollout (of this very stable version) sends this key to the canary."""
    if (rollout is None or rollout.stable_version_id != stable.model_version_id
            or not to_canary(rollout.rollout_id, tenant_id, key, rollout.percent)):
        return VersionChoice(stable, None, None)
    return VersionChoice(rollout.canary, stable, rollout.rollout_id)


class VersionChooser:
    """Which version serves a request, and the canary's fallback to stable (the one place)."""

    def __init__(self, rollouts: RolloutCatalog, fallbacks: FallbackRecorder,
                 num_ready: Callable[[int], Awaitable[int]], prompts: PromptEncoder):
        self._rollouts = rollouts
        self._fallbacks = fallbacks
        self._num_ready = num_ready  # ready replicas of a model version (the router's view)
        self._prompts = prompts

    async def choose(self, stable: ServingVersion, tenant_id: int, key: Callable[[], str],
                     request: GenerationRequest) -> tuple[VersionChoice, Prompt]:
        """The live rollout's split, and the prompt as the chosen version encodes it. A canary
        without a ready replica, or whose tokenizer cannot load, sends the request to stable at
        once (counted: `unavailable`, `failed`). `key()` makes the request's sticky key, called
        only while a rollout is live (most requests need none)."""
        rollout = await self._rollouts.get(stable.model_name)
        if rollout is None:
            choice = VersionChoice(stable, None, None)
        else:
            choice = choose_version(stable, rollout, tenant_id, key())
        if choice.fallback is not None and await self._num_ready(
                choice.target.model_version_id) == 0:
            await self._record(choice.rollout_id, UNAVAILABLE)
            choice = VersionChoice(stable, None, None)
        try:
            return choice, await self._prompts.encode(choice.target, request, tenant_id)
        except ServiceUnavailable:
            if choice.fallback is None:
                raise
            # The canary's tokenizer cannot load: a broken canary, not the customer's problem.
            await self._record(choice.rollout_id, FAILED)
            choice = VersionChoice(choice.fallback, None, None)
            return choice, await self._prompts.encode(choice.target, request, tenant_id)

    async def fall_back(self, prepared: PreparedRequest, *, failed: bool) -> PreparedRequest:
        """The same request on its fallback (stable) version, counted as `failed` (a canary
        replica failed before the first token) or `unavailable` (capacity: no replica, queue
        full). Tokenized again when the tokenizer differs; max_tokens capped to the fallback's
        context window."""
        target = prepared.fallback
        if target is None:
            raise ValueError("this request has no fallback version")
        await self._record(prepared.rollout_id, FAILED if failed else UNAVAILABLE)
        logger.warning("canary %s of rollout %s could not serve %s; falling back to stable",
                       prepared.target.model_version_id, prepared.rollout_id,
                       prepared.request_id)
        prompt = Prompt(prepared.prompt_text, prepared.prompt_token_ids)
        if (target.tokenizer, target.weights_uri) != (prepared.target.tokenizer,
                                                      prepared.target.weights_uri):
            prompt = await self._prompts.encode(target, prepared.request,
                                                prepared.principal.tenant_id)
        room = target.context_length - len(prompt.token_ids)
        if room < 1:
            raise InvalidRequest(f"The prompt has {len(prompt.token_ids)} tokens; the context "
                                 f"window is {target.context_length}.",
                                 code="context_length_exceeded", param="messages")
        return replace(prepared, target=target, fallback=None, prompt_text=prompt.text,
                       prompt_token_ids=prompt.token_ids,
                       max_tokens=min(prepared.max_tokens, room))

    async def _record(self, rollout_id: int, reason: str) -> None:
        try:
            await self._fallbacks.record(rollout_id, reason)
        except Exception:  # noqa: BLE001 - bookkeeping of the canary; the request goes on
            logger.exception("canary fallback of rollout %s not counted", rollout_id)
