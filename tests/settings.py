"""Settings for the test suite: the real settings, with names private to this test run so
concurrent runs on one PostgreSQL/Redis do not collide."""
import os
import uuid

from llm_platform.settings import *  # noqa: F403
from llm_platform.settings import CACHES, DATABASES
from replica.access import access_token

# Inherited by subprocesses (daphne, fakes) started by the tests, so they share these names.
TEST_RUN_ID = os.environ.setdefault("LLMP_TEST_RUN_ID", uuid.uuid4().hex[:8])
REDIS_KEY_PREFIX = f"llmp-test-{TEST_RUN_ID}:"
DATABASES["default"]["TEST"] = {"NAME": f"test_llm_platform_{TEST_RUN_ID}"}
# A test whose connection waits on a lock that another connection never releases (one left in
# a transaction by a cancelled request, say) fails with "canceling statement due to lock
# timeout" instead of hanging the run (PostgreSQL waits for ever by default).
DATABASES["default"]["OPTIONS"] = {**DATABASES["default"].get("OPTIONS", {}),
                                   "options": "-c lock_timeout=120s"}
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [REDIS_URL], "prefix": REDIS_KEY_PREFIX + "asgi"},  # noqa: F405
    }
}
CACHES = {"default": {**CACHES["default"], "KEY_PREFIX": REDIS_KEY_PREFIX + "cache"}}
API_KEY_CACHE_SECONDS = 1.0
QUOTA_LIMITS_CACHE_SECONDS = 0.0  # tests edit limits and expect them seen at once
REGISTRY_CACHE_TTL_SECONDS = 0.0  # tests change replica states and expect them seen at once
TRITON_FIRST_TOKEN_TIMEOUT_SECONDS = 30.0
TRITON_TOKEN_TIMEOUT_SECONDS = 30.0
# The usage outbox of this run only (its tests fill and replay it).
BILLING_OUTBOX_DIR = os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                  f"llmp-test-{TEST_RUN_ID}-billing-outbox")
# Production settings refuse a default key with DEBUG off; the run's own key and replica secret
# (inherited by the platform processes the tests start: tests/e2e/conftest.platform_env).
SECRET_KEY = f"test-secret-key-{TEST_RUN_ID}-not-for-production-use"
REPLICA_SECRET = f"test-replica-secret-{TEST_RUN_ID}"
REPLICA_ACCESS_TOKEN = access_token(REPLICA_SECRET)
