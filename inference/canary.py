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
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Awaitable, Callable

from common.ttl_cache import TtlCache
from inference.canary_split import to_canary
from inference.schemas import GenerationRequest
from models_registry.selectors import ServingVersion


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
    `inference.hooks.rollout_source` in production)."""

    def __init__(self, clock: Callable[[], float], ttl_seconds: float,
                 read: Callable[[str], Awaitable[LiveRollout | None]]):
        self._cache: TtlCache[str, LiveRollout | None] = TtlCache(read, clock, ttl_seconds)

    async def get(self, model_name: str) -> LiveRollout | None:
        return await self._cache.get(model_name)


def choose_version(stable: ServingVersion, rollout: LiveRollout | None, tenant_id: int,
                   key: str) -> VersionChoice:
    """Stable unless the rollout (of this very stable version) sends this key to the canary."""
    if (rollout is None or rollout.stable_version_id != stable.model_version_id
            or not to_canary(rollout.rollout_id, tenant_id, key, rollout.percent)):
        return VersionChoice(stable, None, None)
    return VersionChoice(rollout.canary, stable, rollout.rollout_id)
