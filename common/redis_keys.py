"""Every Redis key layout of the platform, in one place.

Each function takes the deployment's key prefix (settings.REDIS_KEY_PREFIX; tests use a private
one per run) and returns a key. Writers and readers in different apps (the request path writes
admission and outstanding-token counters, the fleet and the consoles read them) call the same
function, so a layout cannot drift between them. Values' formats are documented at the owner
named in each docstring.
"""
from __future__ import annotations

from dataclasses import dataclass


# ---- tenants ----------------------------------------------------------------------------------

def api_key_cache(prefix: str, key_hash: str) -> str:
    """tenants/auth.py: an authenticated key's principal (or a negative entry)."""
    return f"{prefix}apikey:{key_hash}"


def api_key_refused(prefix: str, key_hash: str) -> str:
    """tenants/auth.py: a well-formed key that matched nothing (negative cache)."""
    return f"{prefix}apikey-refused:{key_hash}"


def auth_changes(prefix: str) -> str:
    """tenants/auth.py: pub/sub channel; a revoked key's hash is published there and every API
    process drops its in-process entry for it."""
    return f"{prefix}apikey-changes"


def key_rate(prefix: str, api_key_id: int, window: int) -> str:
    """inference/key_ratelimit.py: one API key's request count in one fixed window."""
    return f"{prefix}keyrate:{api_key_id}:{window}"


def tenant_limits(prefix: str, tenant_id: int) -> str:
    """tenants/selectors.py LimitsCache: the tenant's Limits as JSON."""
    return f"{prefix}limits:{tenant_id}"


def token_buckets(prefix: str, tenant_id: int) -> tuple[str, str]:
    """tenants/buckets.py: the hashes of a tenant's requests and tokens buckets."""
    base = f"{prefix}bucket:{tenant_id}"
    return f"{base}:requests", f"{base}:tokens"


# ---- billing ----------------------------------------------------------------------------------

def usage_stream(prefix: str) -> str:
    """billing/stream.py: the usage events stream (consumer group: billing/consumer.py)."""
    return f"{prefix}billing:usage"


def usage_dead_letters(prefix: str) -> str:
    """billing/stream.py: entries PostgreSQL refused, kept for a human."""
    return f"{prefix}billing:usage:dead"


def usage_lease(prefix: str, request_id: str) -> str:
    """billing/leases.py: held by the process serving a request until its final usage event."""
    return f"{prefix}billing:lease:{request_id}"


# ---- inference: admission ---------------------------------------------------------------------

@dataclass(frozen=True)
class AdmissionKeys:
    """One model's admission queue (inference/admission.py). Readers: fleet/load_readings.py."""

    waiting: str  # hash: ticket `tenant:version:uuid` -> waiter
    running: str  # sorted set: slots held, by lease expiry
    vtime: str  # hash: fair-share virtual time per tenant
    stats: str  # hash: `seq`, `rejected_full`, and per version `seq:<id>`, `rejected_full:<id>`
    capacity: str  # hash

    def as_list(self) -> list[str]:
        """In the order the Lua scripts take them as KEYS."""
        return [self.waiting, self.running, self.vtime, self.stats, self.capacity]


def admission(prefix: str, model: str) -> AdmissionKeys:
    base = f"{prefix}admission:{model}"
    return AdmissionKeys(f"{base}:waiting", f"{base}:running", f"{base}:vtime", f"{base}:stats",
                         f"{base}:capacity")


def admission_models(prefix: str) -> str:
    """inference/admission.py: the set of models with a queue."""
    return f"{prefix}admission:models"


def admission_wake_channel(prefix: str) -> str:
    """inference/admission_wakeups.py: the pub/sub channel that wakes waiters (one per process
    subscribes)."""
    return f"{prefix}admission:wake"


# ---- inference: routing -----------------------------------------------------------------------

def outstanding_tokens(prefix: str, model_version_id: int) -> str:
    """inference/router.py: hash replica id -> tokens sent and not finished. Readers: fleet
    (autoscaler), the replica admin page."""
    return f"{prefix}outstanding:{model_version_id}"


def route_sequence(prefix: str, model_version_id: int) -> str:
    """inference/router.py: round-robin counter."""
    return f"{prefix}route-seq:{model_version_id}"


def prefix_block(prefix: str, model_version_id: int, block_hash: int) -> str:
    """inference/prefix_index.py: replicas that hold this prompt block."""
    return f"{prefix}prefix:{model_version_id}:{block_hash:016x}"


def replica_load(prefix: str, replica_id: int) -> str:
    """inference/replica_signals.py: the replica's last metrics reading."""
    return f"{prefix}signals:{replica_id}"


def replica_load_poll(prefix: str, replica_id: int) -> str:
    """inference/replica_signals.py: who polls the replica's metrics now (a lease)."""
    return f"{prefix}signals:{replica_id}:poll"


def circuit(prefix: str, replica_id: int) -> str:
    """inference/circuit.py: the replica's circuit state."""
    return f"{prefix}circuit:{replica_id}"


def circuit_half_open_trial(prefix: str, replica_id: int) -> str:
    """inference/circuit.py: the one request let through a half-open circuit."""
    return f"{prefix}circuit:{replica_id}:trial"


def routing_models(prefix: str) -> str:
    """inference/routing_stats.py: versions with routing counters."""
    return f"{prefix}routing:models"


def routing_stats(prefix: str, model_version_id: int) -> str:
    """inference/routing_stats.py: per replica and policy counters."""
    return f"{prefix}routing:{model_version_id}"


def request_id_claim(prefix: str, request_id: str) -> str:
    """inference/observability/request_ids.py: a client-sent request id, claimed once."""
    return f"{prefix}reqid:{request_id}"


def metric_family(prefix: str, family: str) -> str:
    """inference/observability/store.py: one hash per metric family, a field per label set."""
    return f"{prefix}obs:{family}"


def api_process(prefix: str, process_id: str) -> str:
    """inference/process_lease.py: exists while an API process runs (its liveness lease); an
    empty `process_id` gives the prefix that idempotency's takeover script appends ids to."""
    return f"{prefix}proc:{process_id}"


def idempotency(prefix: str, tenant_id: int, digest: str) -> str:
    """inference/idempotency.py: a request's claim, then its stored reply."""
    return f"{prefix}idem:{tenant_id}:{digest}"


def canary_fallbacks(prefix: str, rollout_id: int) -> str:
    """inference/fallbacks.py: canary requests stable served, per reason and minute. Reader:
    rollouts/evaluator.py."""
    return f"{prefix}rollout:{rollout_id}:fallbacks"


# ---- fleet ------------------------------------------------------------------------------------

def arrivals_baseline(prefix: str, model_version_id: int) -> str:
    """fleet/load_readings.py: the admission counters at the previous autoscaler tick."""
    return f"{prefix}fleet:arrivals:{model_version_id}"
