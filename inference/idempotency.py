"""Idempotency-Key: tenant-scoped, in Redis.

States of one key: absent -> pending (this request is running; its owner token inside) ->
done (the stored reply, kept `ttl_seconds`) or absent again (the request failed or was
cancelled, so the client may retry with the same key). A pending entry expires after
`pending_ttl_seconds` so a crashed process cannot block the key for long: the running request
refreshes it (`refresh`, from its KeepAlive) well within that TTL.

Takeover: a pending entry names the API process that holds it (`process`, its ProcessLease id:
inference/process_lease.py). When that process's lease is gone (the process was killed), the
entry's request died with it: `begin` with the same key and body then takes the claim over at
once instead of answering 409 until the pending TTL ran out. The dead request's usage row is
finalised by the billing reaper from the replica's ledger (billing/reaper.py); the retry is a
new request with its own request id and usage row, so each computed token is billed once.

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
from inference.process_lease import ProcessLease

logger = logging.getLogger(__name__)

MAX_KEY_LEN = 255

# Claim the key (absent: claim it; pending, same body, its process's lease gone: take it over);
# otherwise return what is there. ARGV: new entry, pending TTL ms, fingerprint, the process
# lease key prefix. Returns {outcome, current or previous value}.
_BEGIN_SCRIPT = """
local value = redis.call('GET', KEYS[1])
if not value then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {'claimed', ''}
end
local entry = cjson.decode(value)
if entry['state'] == 'pending' and entry['fingerprint'] == ARGV[3]
    and type(entry['process']) == 'string'
    and redis.call('EXISTS', ARGV[4] .. entry['process']) == 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {'taken_over', value}
end
return {'present', value}
"""

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
    """`process`: this API process's liveness lease; its id goes into every pending entry this
    store writes. Without one (tests of the store alone), entries name no process and are
    never taken over: only their pending TTL frees them."""

    def __init__(self, redis, key_prefix: str, ttl_seconds: int, pending_ttl_seconds: int,
                 process: ProcessLease | None = None):
        self._redis = redis
        self._process = process
        self._prefix = key_prefix
        self._ttl_ms = ttl_seconds * 1000
        self._pending_ttl_ms = pending_ttl_seconds * 1000
        self._abandon = redis.register_script(_ABANDON_SCRIPT)
        self._refresh = redis.register_script(_REFRESH_SCRIPT)
        self._complete = redis.register_script(_COMPLETE_SCRIPT)
        self._begin = redis.register_script(_BEGIN_SCRIPT)

    def _redis_key(self, tenant_id: int, key: str) -> str:
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return redis_keys.idempotency(self._prefix, tenant_id, digest)

    async def begin(self, tenant_id: int, key: str, body_fingerprint: str) -> Claim | Replay:
        """A Claim to run the request, a Replay of the stored reply, or Conflict (409: still
        running) / Unprocessable (422: the key was used with another body)."""
        redis_key = self._redis_key(tenant_id, key)
        owner = uuid.uuid4().hex
        entry = {"state": "pending", "owner": owner, "fingerprint": body_fingerprint}
        process_prefix = ""
        if self._process is not None:
            entry["process"] = await self._process.ensure()
            process_prefix = self._process.key_prefix
        outcome, raw = await self._begin(
            keys=[redis_key],
            args=[json.dumps(entry), self._pending_ttl_ms, body_fingerprint, process_prefix])
        outcome = outcome.decode() if isinstance(outcome, bytes) else outcome
        if outcome == "claimed":
            return Claim(redis_key=redis_key, owner=owner, fingerprint=body_fingerprint)
        if outcome == "taken_over":
            logger.warning("idempotency key %s: its process %s is gone; the claim is taken over",
                           redis_key, json.loads(raw).get("process"))
            return Claim(redis_key=redis_key, owner=owner, fingerprint=body_fingerprint)
        current = json.loads(raw)
        if current["fingerprint"] != body_fingerprint:
            raise Unprocessable(
                "This Idempotency-Key was already used with a different request body."
            )
        if current["state"] == "pending":
            raise Conflict("A request with this Idempotency-Key is still in progress.")
        return Replay(result=current["result"])

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
