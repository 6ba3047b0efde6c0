"""Web readiness (`/readyz/web`) is PostgreSQL and Redis only; `/readyz` also needs a replica.

A web pod's readiness probe is `/readyz/web`: with scale to zero no replica is ready, and a probe
that required one would pull every web pod out of service, so demand would never reach the
admission queue and the autoscaler (deploy/k8s/base/web-deployment.yaml).
"""
from __future__ import annotations

import json
import socket

import pytest


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_web_ready_without_any_replica(client, model_version):
    web = await client.get("/readyz/web")
    assert web.status_code == 200
    assert json.loads(web.content) == {"status": "ready",
                                       "checks": {"database": True, "redis": True}}

    platform = await client.get("/readyz")
    assert platform.status_code == 503
    assert json.loads(platform.content)["checks"] == {"database": True, "redis": True,
                                                      "replica": False}


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_both_ready_with_a_ready_replica(client, ready_replica):
    assert (await client.get("/readyz/web")).status_code == 200
    platform = await client.get("/readyz")
    assert platform.status_code == 200
    assert json.loads(platform.content)["checks"]["replica"] is True


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_web_not_ready_when_redis_is_unreachable(client, settings):
    # The container (and its Redis client) is built per event loop on first use: after this.
    settings.REDIS_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    web = await client.get("/readyz/web")
    assert web.status_code == 503
    body = json.loads(web.content)
    assert body["status"] == "not_ready"
    assert body["checks"] == {"database": True, "redis": False}


@pytest.mark.asyncio
async def test_liveness_touches_nothing(client, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{_closed_port()}/0"
    response = await client.get("/healthz")  # no database access allowed in this test either
    assert response.status_code == 200
    assert json.loads(response.content) == {"status": "ok"}
