"""UsageEvent: what one request is billed for, and its wire form on the usage stream and in the
outbox (one JSON object; `request_id` is the idempotency key everywhere downstream).

A request sends two: a `pending` one at admission (no tokens; `estimated_tokens` is what the
token bucket was charged) and a final one (ok, failed, cancelled, rejected) with the tokens the
replica computed. The final one finalises the pending row once; a pending one never overwrites
a final one, whatever order they arrive in."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields

import orjson

WIRE_VERSION = 1


@dataclass(frozen=True)
class UsageEvent:
    request_id: str
    tenant_id: int
    api_key_id: int
    model_name: str
    model_version_id: int
    replica_id: int | None
    input_tokens: int  # the whole prompt, cached part included
    cached_tokens: int  # the part of input_tokens served from the prefix cache
    output_tokens: int
    ttft_ms: float | None
    total_ms: float
    status: str  # one of UsageRecord.Status
    finish_reason: str = ""
    endpoint: str = ""
    estimated_tokens: int = 0
    # Wall-clock seconds since the epoch when the request ended; the recorder stamps it with its
    # injected clock when the caller leaves it None. Prices apply by this time, not arrival.
    occurred_at: float | None = None

    @property
    def is_pending(self) -> bool:
        return self.status == "pending"

    def stamped(self, now: float) -> "UsageEvent":
        """This event with `occurred_at` set (itself if it has one). A copy of its fields, not
        `dataclasses.replace` (which runs `__init__` through keyword arguments: a few
        microseconds, twice per request)."""
        if self.occurred_at is not None:
            return self
        event = object.__new__(UsageEvent)
        fields_ = event.__dict__
        fields_.update(self.__dict__)
        fields_["occurred_at"] = now
        return event

    def to_json(self) -> str:
        """Compact JSON, non-ASCII as UTF-8 (orjson: a tenth of the stdlib's cost; every
        request sends two). A float that is not finite is written null."""
        return orjson.dumps({"v": WIRE_VERSION, **self.__dict__}).decode()

    @classmethod
    def from_json(cls, raw: str | bytes) -> "UsageEvent":
        data = json.loads(raw)
        data.pop("v", None)
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
