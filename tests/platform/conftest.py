import asyncio

import pytest
import pytest_asyncio
from asgiref.sync import sync_to_async
from django.db import connections
from django.test import AsyncClient

from billing.stream import close_loop_recorder
from models_registry.models import ModelVersion
from models_registry.services import ensure_model_version, register_replica
from tenants.services import create_api_key, create_tenant
from tests.fakes.triton_server import start_fake
from tests.support.billing import reset_usage_stream
from tests.support.platform import close_loop_container


@pytest.fixture
def tenant(transactional_db):
    return create_tenant("acme", "interactive")


@pytest.fixture
def api_key(tenant) -> str:
    return create_api_key(tenant).raw_key


@pytest.fixture
def auth(api_key) -> dict:
    return {"Authorization": f"Bearer {api_key}"}


@pytest.fixture
def model_version(transactional_db) -> ModelVersion:
    # The byte tokenizer: one token per UTF-8 byte of the ChatML-rendered prompt.
    return ensure_model_version("chat-small", 1, "fake", tokenizer="bytes", context_length=1024)


@pytest_asyncio.fixture(autouse=True)
async def container_cleanup():
    reset_usage_stream()
    yield
    await close_loop_container(asyncio.get_running_loop())
    await close_loop_recorder(asyncio.get_running_loop())
    # Async ORM calls made outside a request keep a connection in asgiref's worker thread;
    # close it so the test database can be dropped.
    await sync_to_async(connections.close_all)()


@pytest_asyncio.fixture
async def fake_replica():
    fake = await start_fake()
    yield fake
    await fake.stop()


@pytest.fixture
def ready_replica(fake_replica, model_version):
    return register_replica(model_version, fake_replica.grpc_address,
                            metrics_address=fake_replica.metrics_address)


@pytest.fixture
def client() -> AsyncClient:
    return AsyncClient()
