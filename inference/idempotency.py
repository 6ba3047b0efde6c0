"""Idempotency-Key: tenant-scoped, in Redis.

States of one key: absent -> pending (this request is running; its owner token inside) ->
done (the stored reply, kept `ttl_seconds`) or absent again (the request failed or was
cancelled, so the client may retry with the same key). A pending entry expires after
`pending_ttl_seconds` so a crashed process cannot block the key for long: the running request
refreshes it (`refresh`, from its KeepAlive) well within that TTL.

Invariant: only the claim's owner moves its pending entry on (to done or absent), atomically in
Redis: a request that outlived its pending entry cannot overwrite the reply or the claim of the
request that took the key after it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass

from inference.errors import Conflict, InvalidRequest, Unprocessable
from common import redis_keys

logger = logging.getLogger(__name__)

MAX_KEY_LEN = 255

# Store the reply only if the key still holds this owner's pending entry.
_COMPLETE_SCRIPT = """
local value = redis.call('GET', KEYS[1])
if value then
  local entry = cjson.decode(value)
  if entry['state'] == 'pending' and entry['owner'] == ARGV[1] then
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
    return 1
  end
end
return 0
"""

# Delete the key only if it still holds this owner's pending entry.
_ABANDON_SCRIPT = """
local value = redis.call('GET', KEYS[1])
if value and cjson.decode(value)['owner'] == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# Extend the pending entry only while this owner still holds it.
_REFRESH_SCRIPT = """
local value = redis.call('GET', KEYS[1])
if value and cjson.decode(value)['owner'] == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""


def fingerprint(endpoint: str, body: dict) -> str:
    """Same endpoint and same JSON body (key order and whitespace aside) -> same fingerprint."""
    canonical = json.dumps({"endpoint": endpoint, "body": body}, sort_keys=True,
                           separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def validate_key(key: str) -> str:
    if not key or len(key) > MAX_KEY_LEN or not key.isprintable():
        raise InvalidRequest(
            f"Idempotency-Key must be 1 to {MAX_KEY_LEN} printable characters.",
            code="invalid_idempotency_key",
        )
    return key


@dataclass(frozen=True)
class Claim:
    """The right to run the request for this key; exactly one holder at a time."""

    redis_key: str
    owner: str
    fingerprint: str


@dataclass(frozen=True)
class Replay:
    result: dict


class IdempotencyStore:
    def __init__(self, redis, key_prefix: str, ttl_seconds: int, pending_ttl_seconds: int):
        self._redis = redis
        self._prefix = key_prefix
        self._ttl_ms = ttl_seconds * 1000
        self._pending_ttl_ms = pending_ttl_seconds * 1000
        self._abandon = redis.register_script(_ABANDON_SCRIPT)
        self._refresh = redis.register_script(_REFRESH_SCRIPT)
        self._complete = redis.register_script(_COMPLETE_SCRIPT)

    def _redis_key(self, tenant_id: int, key: str) -> str:
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return redis_keys.idempotency(self._prefix, tenant_id, digest)

    async def begin(self, tenant_id: int, key: str, body_fingerprint: str) -> Claim | Replay:
        """A Claim to run the request, a Replay of the stored reply, or Conflict (409: still
        running) / Unprocessable (422: the key was used with another body)."""
        redis_key = self._redis_key(tenant_id, key)
        owner = uuid.uuid4().hex
        pending = json.dumps({"state": "pending", "owner": owner, "fingerprint": body_fingerprint})
        for _ in range(3):  # the entry may expire or be abandoned between SET NX and GET
            if await self._redis.set(redis_key, pending, nx=True, px=self._pending_ttl_ms):
                return Claim(redis_key=redis_key, owner=owner, fingerprint=body_fingerprint)
            raw = await self._redis.get(redis_key)
            if raw is None:
                continue
            entry = json.loads(raw)
            if entry["fingerprint"] != body_fingerprint:
                raise Unprocessable(
                    "This Idempotency-Key was already used with a different request body."
                )
            if entry["state"] == "pending":
                raise Conflict("A request with this Idempotency-Key is still in progress.")
            return Replay(result=entry["result"])
        raise Conflict("A request with this Idempotency-Key is still in progress.")

    async def complete(self, claim: Claim, result: dict) -> bool:
        """Store the reply; False (nothing written) if the key no longer holds this claim."""
        done = json.dumps({"state": "done", "fingerprint": claim.fingerprint, "result": result})
        completed = bool(await self._complete(keys=[claim.redis_key],
                                              args=[claim.owner, done, self._ttl_ms]))
        if not completed:
            logger.warning("idempotency key %s: the pending claim had expired or passed to "
                           "another request; this reply is not stored", claim.redis_key)
        return completed

    async def abandon(self, claim: Claim) -> None:
        await self._abandon(keys=[claim.redis_key], args=[claim.owner])

    async def refresh(self, claim: Claim) -> bool:
        """Keep the pending entry alive while its request runs; False once it is not ours."""
        return bool(await self._refresh(keys=[claim.redis_key],
                                        args=[claim.owner, self._pending_ttl_ms]))
