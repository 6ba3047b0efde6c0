"""Settings, all from the environment. PostgreSQL and Redis are required (no SQLite path)."""
from __future__ import annotations

from pathlib import Path

from llm_platform.logging import logging_config
from llm_platform.env import (
    env_bool,
    env_file,
    env_float,
    env_int,
    env_list,
    env_pair,
    env_str,
    parse_database_url,
)
from replica.access import access_token

BASE_DIR = Path(__file__).resolve().parent.parent

# With DEBUG off, startup refuses a missing, default or short SECRET_KEY (llm_platform/checks.py).
# SECRET_KEY, else the file SECRET_KEY_FILE (default var/secret_key: `make serve` writes one per
# install, so manage.py in the same checkout finds it; a mounted secret elsewhere).
SECRET_KEY = env_str("SECRET_KEY", "") or env_file(
    "SECRET_KEY_FILE", BASE_DIR / "var" / "secret_key")
DEBUG = env_bool("DEBUG", False)
if DEBUG and not SECRET_KEY:
    SECRET_KEY = "dev-insecure-change-me"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])

# --- Production hardening (docs/security.md) ----------------------------------------------------
# Behind a TLS-terminating proxy: SECURE_PROXY_SSL_HEADER="HTTP_X_FORWARDED_PROTO,https".
SECURE_PROXY_SSL_HEADER = env_pair("SECURE_PROXY_SSL_HEADER")
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
SECURE_CONTENT_TYPE_NOSNIFF = True
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
     "OPTIONS": {"min_length": env_int("PASSWORD_MIN_LENGTH", 10)}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# GET /metrics answers loopback clients (unless METRICS_ALLOW_LOOPBACK is false: behind a proxy
# on the same host every client looks local) and `Authorization: Bearer <METRICS_TOKEN>`.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
METRICS_ALLOW_LOOPBACK = env_bool("METRICS_ALLOW_LOOPBACK", True)

# --- Replica access (replica/access.py) ----------------------------------------------------------
# Only the platform may call a replica: every call carries a token derived from REPLICA_SECRET
# (default: derived from SECRET_KEY, which every platform process and node agent shares).
# Node agents start their replicas with it; a replica started by hand takes the token in its
# REPLICA_ACCESS_TOKEN environment variable (`manage.py replicatoken` prints it).
REPLICA_SECRET = env_str("REPLICA_SECRET", "") or f"from SECRET_KEY:{SECRET_KEY}"
REPLICA_ACCESS_TOKEN = access_token(REPLICA_SECRET)

INSTALLED_APPS = [
    "llm_platform.apps.PlatformConfig",  # startup checks (llm_platform/checks.py)
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "channels",
    "tenants",
    # The layering, lowest first (docs/architecture.md; .importlinter checks it).
    "models_registry",
    "billing",
    "inference",
    "fleet",
    "rollouts",
    "dashboard",
    "consoles",  # last: its post_migrate sets up the role groups once every permission exists
]

MIDDLEWARE = [
    # First: request id, log context and HTTP metrics for everything below it.
    "inference.observability.middleware.RequestContextMiddleware",
    # Django's stock middleware, without a thread hop per API request (llm_platform/middleware.py):
    # the pure ones run on the event loop, the browser ones skip /v1/.
    "llm_platform.middleware.InlineSecurityMiddleware",
    "llm_platform.middleware.BrowserOnlySessionMiddleware",
    "llm_platform.middleware.InlineCommonMiddleware",
    "llm_platform.middleware.BrowserOnlyCsrfViewMiddleware",
    "llm_platform.middleware.BrowserOnlyAuthenticationMiddleware",
    "llm_platform.middleware.BrowserOnlyMessageMiddleware",
    "llm_platform.middleware.InlineXFrameOptionsMiddleware",
]

ROOT_URLCONF = "llm_platform.urls"
ASGI_APPLICATION = "llm_platform.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {
    "default": {
        **parse_database_url(
            env_str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/llm_platform")
        ),
        # Under ASGI Django runs each request's ORM calls on a thread of that request, so
        # persistent per-thread connections pile up (one per concurrent request; PostgreSQL ran
        # out of connections under load). A psycopg pool per process bounds them instead: a
        # request borrows a connection and returns it when it closes.
        "CONN_MAX_AGE": 0,
        # A pooled connection that PostgreSQL closed meanwhile (a restart, a failover, an idle
        # cut) is found out when the pool lends it (psycopg_pool's check_connection), not by
        # the query it would fail: one empty round trip per checkout, rare on the API's hot
        # path (keys and tenant limits are cached in process).
        "CONN_HEALTH_CHECKS": True,
        "OPTIONS": {
            "pool": {
                "min_size": env_int("DB_POOL_MIN_SIZE", 1),
                "max_size": env_int("DB_POOL_MAX_SIZE", 8),
                "timeout": env_float("DB_POOL_TIMEOUT_SECONDS", 5.0),
            },
            # PostgreSQL unreachable: a new connection fails within this (libpq, whole seconds),
            # and the API answers 503 + Retry-After (inference/views/errors.py).
            "connect_timeout": env_int("DB_CONNECT_TIMEOUT_SECONDS", 2),
        },
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Every Redis client (llm_platform/redis_clients.py): a hung or unreachable Redis fails a command
# within these bounds (the API answers 503 + Retry-After); a pool that is busy makes a command
# wait up to REDIS_POOL_TIMEOUT_SECONDS for a connection instead of failing at once.
REDIS_CONNECT_TIMEOUT_SECONDS = env_float("REDIS_CONNECT_TIMEOUT_SECONDS", 1.0)
REDIS_SOCKET_TIMEOUT_SECONDS = env_float("REDIS_SOCKET_TIMEOUT_SECONDS", 2.0)
REDIS_POOL_MAX_SIZE = env_int("REDIS_POOL_MAX_SIZE", 64)
REDIS_POOL_TIMEOUT_SECONDS = env_float("REDIS_POOL_TIMEOUT_SECONDS", 2.0)
# The asyncio clients' plain pipelines over a lean connection pool of their own
# (common/lean_redis.py); 0: through redis-py's pool like every other command.
REDIS_LEAN_PIPELINES = env_bool("REDIS_LEAN_PIPELINES", True)
# On that connection, every this many batches queued in one loop iteration are written at once
# instead of at the iteration's end, so Redis starts on a burst's first requests while the
# loop makes the rest's (0: one write per iteration; round frontdoor22, benchmarks/README.md).
REDIS_LEAN_FLUSH_BATCHES = env_int("REDIS_LEAN_FLUSH_BATCHES", 16)
# Retry-After (seconds) with the 503 when Redis or PostgreSQL fails a request.
DEPENDENCY_RETRY_AFTER_SECONDS = env_int("DEPENDENCY_RETRY_AFTER_SECONDS", 1)
# Every platform key in Redis starts with this, so several deployments (or test runs) can
# share one Redis without seeing each other's counters.
REDIS_KEY_PREFIX = env_str("REDIS_KEY_PREFIX", "llmp:")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # channels_redis blocks up to 5 s per receive (BRPOP): its read timeout is above that.
        "CONFIG": {"hosts": [{"address": REDIS_URL,
                               "socket_timeout": max(10.0, REDIS_SOCKET_TIMEOUT_SECONDS),
                               "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_SECONDS}],
                   "prefix": REDIS_KEY_PREFIX + "asgi"},
    }
}

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
# Workers log through LOGGING (JSON lines) instead of Celery's own root-logger format.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "replica-health": {
        "task": "fleet.tasks.check_replica_health",
        "schedule": env_float("REPLICA_HEALTH_INTERVAL_SECONDS", 10.0),
    },
}
CELERY_TIMEZONE = "UTC"

# --- Fleet control: node agents, lifecycle, autoscaler ------------------------------------------
# A node agent heartbeats every NODE_HEARTBEAT_SECONDS (its own env); a node silent this long is
# presumed lost: its replicas fail and are replaced elsewhere.
NODE_LOST_AFTER_SECONDS = env_float("NODE_LOST_AFTER_SECONDS", 15.0)
AUTOSCALER_INTERVAL_SECONDS = env_float("AUTOSCALER_INTERVAL_SECONDS", 5.0)
# With no replica ready but one loading (or scale to zero on), a request waits this long for
# the first replica instead of a 503.
COLD_START_MAX_WAIT_SECONDS = env_float("COLD_START_MAX_WAIT_SECONDS", 180.0)
CELERY_BEAT_SCHEDULE.update({
    "autoscale": {
        "task": "fleet.tasks.autoscale",
        "schedule": AUTOSCALER_INTERVAL_SECONDS,
    },
    "detect-lost-nodes": {
        "task": "fleet.tasks.detect_lost_nodes_task",
        "schedule": env_float("LOST_NODE_CHECK_INTERVAL_SECONDS", 5.0),
    },
})

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"

REST_FRAMEWORK = {"UNAUTHENTICATED_USER": None}

# JSON lines (time, level, logger, request_id, tenant_id, model); LOG_FORMAT=console for people
# at a terminal, auto (the default) picks console when stderr is one (llm_platform/logging.py).
LOGGING = logging_config(env_str("LOG_LEVEL", "INFO"), env_str("LOG_FORMAT", "auto"))

# --- The customer API -------------------------------------------------------------------------
# Bodies over this many bytes get 413 (Django's own limit is aligned so it never answers 400).
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 1024 * 1024)
# POST /v1/generate, /v1/chat/completions and /v1/completions served straight from ASGI, past
# Django's handler and middleware, with the same replies (inference/views/direct.py). 0: through
# Django like every other path.
API_DIRECT_PATH = env_bool("API_DIRECT_PATH", True)
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES
# While requests wait for their first token, streams that already have one hold their tokens
# for at most this long, then send them together (inference/first_token_priority.py; 0: off).
API_RELAY_DEFER_MS = env_float("API_RELAY_DEFER_MS", 20.0)
# The API process's young-generation GC threshold; the collection runs when no generation
# request is in flight (llm_platform/idle_gc.py). 0: Python's own thresholds (700).
API_GC_YOUNG_THRESHOLD = env_int("API_GC_YOUNG_THRESHOLD", 20000)
# /healthz also reports the answering process's id (tests and benchmarks that check several API
# processes share one port; off in deployments).
API_REPORT_PROCESS_ID = env_bool("API_REPORT_PROCESS_ID", False)
# An API key looked up in the database is trusted from the cache (Redis, and each process's
# memory until this long after the Redis entry was written) for this long; revocation through
# the service deletes the Redis entry and tells every process to drop its own at once.
API_KEY_CACHE_SECONDS = env_float("API_KEY_CACHE_SECONDS", 5.0)
# A presented key that matched nothing is refused from Redis (no database query) for this long.
# New keys are random, so none is refused in advance; a reactivated tenant's keys work again
# within this time.
API_KEY_NEGATIVE_CACHE_SECONDS = env_float("API_KEY_NEGATIVE_CACHE_SECONDS", 60.0)
IDEMPOTENCY_TTL_SECONDS = env_int("IDEMPOTENCY_TTL_SECONDS", 24 * 3600)
# How long a request holds its Idempotency-Key "in flight" if its process dies mid-request
# (the running request refreshes it every REQUEST_KEEPALIVE_SECONDS).
IDEMPOTENCY_PENDING_TTL_SECONDS = env_int("IDEMPOTENCY_PENDING_TTL_SECONDS", 60)
# Each API process keeps a liveness key in Redis this long past its last refresh (every quarter
# of it); a pending Idempotency-Key whose process's key is gone is taken over by the retry at
# once (inference/process_lease.py). Above any Redis pause to ride out: a longer pause makes
# live processes look dead.
API_PROCESS_LEASE_TTL_SECONDS = env_float("API_PROCESS_LEASE_TTL_SECONDS", 10.0)
# Retry-After (seconds) sent with 503 when no replica of the model is ready.
NO_REPLICA_RETRY_AFTER_SECONDS = env_int("NO_REPLICA_RETRY_AFTER_SECONDS", 5)
# How many replicas a request tries when one fails before its first token.
ROUTER_MAX_ATTEMPTS = env_int("ROUTER_MAX_ATTEMPTS", 3)
# Routing (inference/router.py). The prefix index forgets a replica's blocks after this long
# without a request sending them there (the replica's LRU has likely evicted them by then).
ROUTER_PREFIX_TTL_SECONDS = env_float("ROUTER_PREFIX_TTL_SECONDS", 300.0)
# Leading prompt blocks hashed for prefix affinity (16 tokens each).
ROUTER_PREFIX_MAX_BLOCKS = env_int("ROUTER_PREFIX_MAX_BLOCKS", 128)
# Each replica's metrics port is polled this often (one process per tick polls each replica);
# its signals expire after ROUTER_SIGNALS_TTL_SECONDS without a successful poll. 0 = no polling.
ROUTER_SIGNALS_INTERVAL_SECONDS = env_float("ROUTER_SIGNALS_INTERVAL_SECONDS", 1.0)
ROUTER_SIGNALS_TTL_SECONDS = env_float("ROUTER_SIGNALS_TTL_SECONDS", 3.0)
ROUTER_SIGNALS_TIMEOUT_SECONDS = env_float("ROUTER_SIGNALS_TIMEOUT_SECONDS", 0.5)
# Circuit breaker per replica: this many consecutive faults open it for the cool-down; then one
# request may go, the half-open trial (its claim lapses after the trial timeout if its process
# dies). The old name ROUTER_CIRCUIT_PROBE_TIMEOUT_SECONDS is still read.
ROUTER_CIRCUIT_FAILURES = env_int("ROUTER_CIRCUIT_FAILURES", 3)
ROUTER_CIRCUIT_COOLDOWN_SECONDS = env_float("ROUTER_CIRCUIT_COOLDOWN_SECONDS", 10.0)
ROUTER_CIRCUIT_TRIAL_TIMEOUT_SECONDS = env_float(
    "ROUTER_CIRCUIT_TRIAL_TIMEOUT_SECONDS", env_float("ROUTER_CIRCUIT_PROBE_TIMEOUT_SECONDS", 30.0))
# Model versions and ready-replica lists are read from PostgreSQL at most this often per process
# (a registry change reaches every process within this time).
REGISTRY_CACHE_TTL_SECONDS = env_float("REGISTRY_CACHE_TTL_SECONDS", 1.0)
# A cached registry entry asked for in the last quarter of its TTL is read again in the
# background (common/ttl_cache.py): under steady traffic no request waits for PostgreSQL.
# 0: each request that finds an entry expired reads it (the former way).
REGISTRY_CACHE_REFRESH_AHEAD = env_bool("REGISTRY_CACHE_REFRESH_AHEAD", True)
# Encoded pieces of chat prompts (a system message, earlier turns: the text between the
# tokenizer's special tokens) kept per process and tokenizer, per tenant, up to this many
# characters, each entry counting 64 more (inference/prompt_segments.py; the same ids as
# encoding anew; ~10-20 MB at the default). 0: none.
PROMPT_SEGMENT_CACHE_CHARS = env_int("PROMPT_SEGMENT_CACHE_CHARS", 4_000_000)
# No hang: a replica that sends nothing for this long fails the request.
TRITON_FIRST_TOKEN_TIMEOUT_SECONDS = env_float("TRITON_FIRST_TOKEN_TIMEOUT_SECONDS", 120.0)
TRITON_TOKEN_TIMEOUT_SECONDS = env_float("TRITON_TOKEN_TIMEOUT_SECONDS", 60.0)
# Requests to a replica share up to this many long-lived ModelStreamInfer calls per API process
# (inference/triton_calls.py), each closed after TRITON_CALL_IDLE_SECONDS without a request.
# 0: one call per request (the former way). On channels (TRITON_CHANNELS) the fewer the calls,
# the more requests share a replica flush's response and a submission write: one call against
# two, side by side against the fake replica, took the API's CPU per streamed token to 0.76x,
# over 32-stream bursts to 0.73-0.84x and per short request to 0.92x; its TTFT gain at 32
# streams is within the noise. Round frontdoor25 kept two because `benchmarks.routing` with two
# API processes placed requests unevenly in 3 of 10 one-call runs; the cause was the warm-up's
# placement across processes (a process made up for part of the other's decisions, read a
# round trip late), which `balanced` now decides in Redis (inference/routing_decision.py), and
# one call is the default again (benchmarks/README.md, "frontdoor26"). 16 calls cost 26 % more
# CPU per streamed token than one ("frontdoor9"). Without channels, 16 did better (~10 % less
# than one call per request).
TRITON_CALLS_PER_REPLICA = env_int("TRITON_CALLS_PER_REPLICA", 1)
TRITON_CALL_IDLE_SECONDS = env_float("TRITON_CALL_IDLE_SECONDS", 1.0)
# A shared call's requests get their tokens batched on a channel (one response per replica
# flush for all of them: replica/backend/channel.py) where the replica takes one. 0: a
# response per token and request, as before.
TRITON_CHANNELS = env_bool("TRITON_CHANNELS", True)

# A client's X-Request-Id is kept if no request used it within this long (else a fresh id).
REQUEST_ID_CLAIM_SECONDS = env_int("REQUEST_ID_CLAIM_SECONDS", 24 * 3600)
# Request metrics are gathered in each process and written to Redis this often (off the reply's
# path); a process's own /metrics writes its share first (inference/observability/buffer.py).
METRICS_FLUSH_SECONDS = env_float("METRICS_FLUSH_SECONDS", 0.5)

# --- Quotas and admission ---------------------------------------------------------------------
# A tenant's limits (tier defaults, tenant overrides) are cached in Redis this long: an edit in
# the admin takes effect on every process within this time.
QUOTA_LIMITS_CACHE_SECONDS = env_float("QUOTA_LIMITS_CACHE_SECONDS", 2.0)
# django-ratelimit on the API: requests per API key id, HTTP and WebSocket alike (a coarse
# abuse guard in front of the per-tenant token buckets, which carry the real limits).
API_KEY_RATELIMIT = env_str("API_KEY_RATELIMIT", "6000/m")
# The admission queue (per model, its versions share it; in Redis): slots per ready replica (how many
# requests run at once on one replica before others wait), the most requests waiting, the
# waiting order (fair_share: tier, then least-served tenant; fifo: tier, then arrival).
ADMISSION_SLOTS_PER_REPLICA = env_int("ADMISSION_SLOTS_PER_REPLICA", 16)
ADMISSION_MAX_QUEUE = env_int("ADMISSION_MAX_QUEUE", 256)
# Extra slots per ready replica, only for tenants running less than their fair share of the
# slots (slots / tenants running or waiting; nothing running always qualifies). 0 = none.
ADMISSION_HEADROOM_SLOTS_PER_REPLICA = env_int("ADMISSION_HEADROOM_SLOTS_PER_REPLICA", 2)
ADMISSION_POLICY = env_str("ADMISSION_POLICY", "fair_share")
# Whether the engine shares capacity fairly between tenants (the platform sends the tenant as
# the engine's fair-share unit); off only to measure the baseline (benchmarks/fairness.py).
ENGINE_FAIR_SHARE = env_bool("ENGINE_FAIR_SHARE", True)
# An admission slot is a lease: it expires this long after its holder last refreshed it (the
# holder refreshes it, its outstanding-token lease and its pending Idempotency-Key every
# REQUEST_KEEPALIVE_SECONDS while the request runs); a dead process's slots come back by then.
ADMISSION_SLOT_TTL_SECONDS = env_float("ADMISSION_SLOT_TTL_SECONDS", 30.0)
REQUEST_KEEPALIVE_SECONDS = env_float("REQUEST_KEEPALIVE_SECONDS", 5.0)
# Every request gets its final answer within this bound (the whole reply, or the end of its
# stream): past it, 504 deadline_exceeded (or the stream's error event) and everything it
# holds is released.
REQUEST_DEADLINE_SECONDS = env_float("REQUEST_DEADLINE_SECONDS", 600.0)
# Everything before generation (auth, limits, catalogue, tokenizer, idempotency, quota) must
# finish within this, else 503 dependency_timeout: a hung PostgreSQL has no read timeout.
REQUEST_PREPARE_TIMEOUT_SECONDS = env_float("REQUEST_PREPARE_TIMEOUT_SECONDS", 15.0)
# Each PostgreSQL query of an API request or WebSocket message: past this its connection is cut
# (503 database_unavailable; PostgreSQL has no read timeout of its own: llm_platform/db_watchdog.py).
DB_QUERY_TIMEOUT_SECONDS = env_float("DB_QUERY_TIMEOUT_SECONDS", 5.0)
# Each release step of a finishing request (slot, lease, idempotency, quota) waits at most
# this long for Redis; what it could not release expires by itself (leases, pending keys).
CLEANUP_STEP_TIMEOUT_SECONDS = env_float("CLEANUP_STEP_TIMEOUT_SECONDS", 3.0)
# A WebSocket that has not sent an authenticated request within this long is closed.
WEBSOCKET_AUTH_TIMEOUT_SECONDS = env_float("WEBSOCKET_AUTH_TIMEOUT_SECONDS", 10.0)
# Retry-After (seconds) with the 503 for a full queue.
ADMISSION_FULL_RETRY_AFTER_SECONDS = env_int("ADMISSION_FULL_RETRY_AFTER_SECONDS", 2)
# Console (admin) login attempts per client address.
LOGIN_RATELIMIT = env_str("LOGIN_RATELIMIT", "10/m")
RATELIMIT_USE_CACHE = "default"
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": REDIS_KEY_PREFIX + "cache",
        # One pool per process, not one per request context (llm_platform/cache.py).
        "OPTIONS": {"pool_class": "llm_platform.cache.SharedConnectionPool",
                    "socket_timeout": REDIS_SOCKET_TIMEOUT_SECONDS,
                    "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_SECONDS},
    }
}

# --- Metering and billing ---------------------------------------------------------------------
# The request path waits at most this long for Redis before the usage event goes to the outbox.
USAGE_STREAM_TIMEOUT_SECONDS = env_float("USAGE_STREAM_TIMEOUT_SECONDS", 0.5)
# After Redis failed, events go straight to the outbox for this long before Redis is tried again.
USAGE_STREAM_RETRY_SECONDS = env_float("USAGE_STREAM_RETRY_SECONDS", 1.0)
# The local durable outbox (one per host; replayed by that host's billing consumer).
BILLING_OUTBOX_DIR = env_str("BILLING_OUTBOX_DIR", str(BASE_DIR / "var" / "billing-outbox"))
BILLING_CONSUMER_BATCH = env_int("BILLING_CONSUMER_BATCH", 500)
# A consumer's pending entries idle this long are claimed by another (it is presumed dead).
BILLING_CLAIM_IDLE_MS = env_int("BILLING_CLAIM_IDLE_MS", 30_000)
# Roll-ups recompute every hour that received a usage row within this window.
BILLING_ROLLUP_WINDOW_SECONDS = env_int("BILLING_ROLLUP_WINDOW_SECONDS", 2 * 3600)
# A request's usage lease (billing/leases.py) expires this long after its process stopped
# refreshing it; then the reaper may finalise its pending usage row.
BILLING_LEASE_TTL_SECONDS = env_float("BILLING_LEASE_TTL_SECONDS", 30.0)
# When a stream ended without the replica's final chunk (cancel, failure), the request path asks
# the replica what it computed, waiting at most this long for the replica to end the request.
BILLING_REPLICA_USAGE_WAIT_SECONDS = env_float("BILLING_REPLICA_USAGE_WAIT_SECONDS", 5.0)
# The reaper: pending rows at least this old, with their lease gone, are finalised from the
# replicas' usage ledgers; after BILLING_REAPER_GIVE_UP_SECONDS from what the replicas answered.
BILLING_REAPER_MIN_AGE_SECONDS = env_float("BILLING_REAPER_MIN_AGE_SECONDS", 10.0)
BILLING_REAPER_GIVE_UP_SECONDS = env_float("BILLING_REAPER_GIVE_UP_SECONDS", 3600.0)
CELERY_BEAT_SCHEDULE.update({
    "billing-reaper": {
        "task": "inference.tasks.reap_usage_task",
        "schedule": env_float("BILLING_REAPER_INTERVAL_SECONDS", 30.0),
    },
    "billing-rollup": {
        "task": "billing.tasks.rollup_usage_task",
        "schedule": env_float("BILLING_ROLLUP_INTERVAL_SECONDS", 300.0),
    },
    "billing-invoices": {
        # Idempotent: issues last month's missing invoices; hourly so a month end is not missed.
        "task": "billing.tasks.issue_invoices_task",
        "schedule": env_float("BILLING_INVOICE_INTERVAL_SECONDS", 3600.0),
    },
})

# --- Canary rollouts --------------------------------------------------------------------------
# How often Celery beat evaluates live rollouts (advance, promote or roll back).
ROLLOUT_EVALUATE_INTERVAL_SECONDS = env_float("ROLLOUT_EVALUATE_INTERVAL_SECONDS", 30.0)
# The quality probe waits at most this long for one answer of a replica.
ROLLOUT_PROBE_TIMEOUT_SECONDS = env_float("ROLLOUT_PROBE_TIMEOUT_SECONDS", 120.0)
# A rollout whose canary has no ready replica this long after it started is rolled back (its
# replicas cannot be placed, its weights cannot download, or its engine never warms up).
ROLLOUT_READY_TIMEOUT_SECONDS = env_float("ROLLOUT_READY_TIMEOUT_SECONDS", 1800.0)
CELERY_BEAT_SCHEDULE.update({
    "rollout-evaluator": {
        "task": "rollouts.tasks.evaluate_rollouts",
        "schedule": ROLLOUT_EVALUATE_INTERVAL_SECONDS,
    },
})

# --- Consoles (staff admin console, tenant dashboard) -------------------------------------------
LOGIN_URL = "/dashboard/login/"
# Sessions (admin and dashboard) end this long after log-in, whatever happens in between.
SESSION_COOKIE_AGE = env_int("SESSION_COOKIE_AGE", 8 * 3600)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", False)  # true behind HTTPS
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", SESSION_COOKIE_SECURE)
# daphne serves /static/ itself (admin and dashboard CSS/JS; no CDN, nothing from outside).
SERVE_STATIC = env_bool("SERVE_STATIC", True)
# How often the live fleet page receives replica loads (seconds).
FLEET_LOAD_INTERVAL_SECONDS = env_float("FLEET_LOAD_INTERVAL_SECONDS", 2.0)
