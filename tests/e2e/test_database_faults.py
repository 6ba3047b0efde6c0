"""PostgreSQL gone (every connection cut, new ones refused) answers 503 database_unavailable
with Retry-After within the pool's wait; PostgreSQL hung (connections open, nothing answers)
answers 503 within REQUEST_PREPARE_TIMEOUT_SECONDS; never a 500 or a hang, and service comes
back by itself when PostgreSQL does. daphne reaches the real PostgreSQL through a TCP proxy
the test takes down and brings back up, or freezes and thaws."""
from __future__ import annotations

import time
import uuid

import httpx
import pytest
from django.db import connection

from tenants.services import create_api_key, create_tenant
from tests.e2e.conftest import _database_url, daphne_server, platform_env, register_chat_small
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
POOL_TIMEOUT_S = 2
PREPARE_TIMEOUT_S = 3


@pytest.fixture
def proxied(transactional_db, settings):
    db = connection.settings_dict
    proxy = TcpProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432)).up()
    url = _database_url().replace(f":{db['PORT'] or 5432}/", f":{proxy.port}/")
    env = platform_env(
        DATABASE_URL=url, REDIS_KEY_PREFIX=settings.REDIS_KEY_PREFIX + f"db-{uuid.uuid4().hex[:4]}:",
        DB_POOL_TIMEOUT_SECONDS=str(POOL_TIMEOUT_S), DB_CONNECT_TIMEOUT_SECONDS="2",
        API_KEY_CACHE_SECONDS="0", QUOTA_LIMITS_CACHE_SECONDS="0",
        REQUEST_PREPARE_TIMEOUT_SECONDS=str(PREPARE_TIMEOUT_S))
    try:
        with daphne_server("daphne-db-proxy", env) as (base_url, _):
            yield base_url, proxy
    finally:
        proxy.down()


def _setup(replica_server) -> dict:
    tenant = create_tenant(f"db-{uuid.uuid4().hex[:4]}", "interactive")
    register_chat_small(replica_server)
    return {"Authorization": f"Bearer {create_api_key(tenant).raw_key}"}


def _unavailable_within(url: str, auth: dict, within_s: float) -> None:
    started = time.monotonic()
    response = httpx.post(url + "/v1/generate", json=BODY, headers=auth, timeout=60)
    elapsed = time.monotonic() - started
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] in {"database_unavailable", "dependency_timeout"}
    assert int(response.headers["Retry-After"]) >= 1
    assert elapsed < within_s + 8  # plus a busy machine's slack


def _recovers(url: str, auth: dict) -> None:
    end = time.monotonic() + 30
    while True:  # a client retrying after Retry-After
        response = httpx.post(url + "/v1/generate", json=BODY, headers=auth, timeout=60)
        if response.status_code == 200 or time.monotonic() > end:
            break
        assert response.status_code == 503, response.text
        time.sleep(0.5)  # the client's retry
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("replica_server", ["fake"], indirect=True)
def test_database_gone_is_503_and_service_returns_with_it(proxied, replica_server):
    url, proxy = proxied
    auth = _setup(replica_server)
    assert httpx.post(url + "/v1/generate", json=BODY, headers=auth, timeout=60).status_code == 200
    proxy.down()
    for _ in range(2):
        _unavailable_within(url, auth, POOL_TIMEOUT_S)
    proxy.up()
    _recovers(url, auth)


@pytest.mark.parametrize("replica_server", ["fake"], indirect=True)
def test_database_hung_is_503_and_service_returns_with_it(proxied, replica_server):
    url, proxy = proxied
    auth = _setup(replica_server)
    assert httpx.post(url + "/v1/generate", json=BODY, headers=auth, timeout=60).status_code == 200
    proxy.freeze()
    try:
        for _ in range(2):
            _unavailable_within(url, auth, PREPARE_TIMEOUT_S)
    finally:
        proxy.thaw()
    _recovers(url, auth)
