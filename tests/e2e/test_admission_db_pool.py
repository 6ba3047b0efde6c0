"""Requests waiting in the admission queue (or streaming) hold no database connection: with a
pool of 2, a slow request streaming and 3 more waiting, the waiting ones got through the
database (they are queued) and another request still reads PostgreSQL. Before the fix each
kept its connection to the end, the pool ran dry and everyone got 503 database_unavailable
after DB_POOL_TIMEOUT_SECONDS (the fairness benchmark's victims waited that long)."""
from __future__ import annotations

import re
import threading

import httpx
import pytest

from tenants.services import create_api_key, create_tenant
from tests.e2e.conftest import daphne_server, platform_env, register_chat_small
from tests.support.processes import wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
SLOW = {**BODY, "messages": [{"role": "user", "content": "[slow] Hi"}], "max_tokens": 2000,
        "stream": True}


@pytest.fixture
def small_pool_url(transactional_db, settings):
    env = platform_env(
        REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX + "pool:",
        DB_POOL_MAX_SIZE="2", DB_POOL_TIMEOUT_SECONDS="3",
        ADMISSION_SLOTS_PER_REPLICA="1", ADMISSION_HEADROOM_SLOTS_PER_REPLICA="0",
        # every request reads PostgreSQL (no cached key, limits or registry)
        API_KEY_CACHE_SECONDS="0", QUOTA_LIMITS_CACHE_SECONDS="0")
    with daphne_server("daphne-small-pool", env) as served:
        yield served


def _queue_depth(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=10).text
    match = re.search(r'llmp_admission_queue_depth\{model="chat-small"\} (\d+)', text)
    return int(match.group(1)) if match else 0


@pytest.mark.parametrize("replica_server", ["fake"], indirect=True)
def test_waiting_and_streaming_requests_hold_no_database_connection(small_pool_url,
                                                                   replica_server):
    url, daphne = small_pool_url
    tenant = create_tenant("pool", "interactive")
    register_chat_small(replica_server)
    auth = {"Authorization": f"Bearer {create_api_key(tenant).raw_key}"}
    statuses: list[int] = []

    def post():
        statuses.append(httpx.post(url + "/v1/generate", json=BODY, headers=auth,
                                   timeout=120).status_code)

    with httpx.Client(timeout=120) as client:
        with client.stream("POST", url + "/v1/generate", json=SLOW,
                           headers=auth) as streaming:  # holds the one slot
            assert streaming.status_code == 200
            lines = streaming.iter_lines()  # kept referenced: a dropped iterator closes the stream
            next(lines)
            waiting = [threading.Thread(target=post) for _ in range(3)]
            for thread in waiting:
                thread.start()
            wait_until(lambda: _queue_depth(url) == 3, daphne, 30,
                       "3 requests queued past the database")
            models = httpx.get(url + "/v1/models", headers=auth, timeout=30)
            assert models.status_code == 200  # the pool still has a connection to lend
            lines.close()
    for thread in waiting:
        thread.join(120)
    assert statuses == [200, 200, 200]
