"""The sticky traffic split of a rollout: pure functions, no Django.

A request's sticky key (its conversation, else its Idempotency-Key, ...: see
`inference/canary.py`) is hashed with the rollout id and the tenant into a bucket 0..9999;
the request goes to the canary when `bucket < percent * 100`.

Invariants:
- deterministic: the same key, tenant and rollout always give the same bucket, in every
  process (blake2b, not Python's salted `hash`);
- monotone: raising the share only moves keys from stable to canary, never back, so a
  conversation that met the canary keeps it as the rollout advances;
- independent across rollouts: the rollout id is hashed in, so the same 5% of conversations
  is not the guinea pig of every rollout.
"""
from __future__ import annotations

import hashlib

NUM_BUCKETS = 10_000


def bucket(rollout_id: int, tenant_id: int, key: str) -> int:
    digest = hashlib.blake2b(f"{rollout_id}\x00{tenant_id}\x00{key}".encode("utf-8"),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big") % NUM_BUCKETS


def to_canary(rollout_id: int, tenant_id: int, key: str, percent: float) -> bool:
    """True when this key's requests go to the canary at `percent` (0..100) of traffic."""
    threshold = round(max(0.0, min(100.0, percent)) * NUM_BUCKETS / 100)
    return bucket(rollout_id, tenant_id, key) < threshold
