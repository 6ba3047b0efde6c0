import pytest
from django.db import connections

from models_registry.services import ensure_model_version
from tenants.services import create_api_key, create_tenant
from tests.support.billing import reset_usage_stream


@pytest.fixture(autouse=True)
def clean_stream():
    reset_usage_stream()
    yield
    reset_usage_stream()


@pytest.fixture
def model_version(transactional_db):
    return ensure_model_version("chat-small", 1, "fake", tokenizer="bytes", context_length=1024)


@pytest.fixture
def account(transactional_db):
    """(tenant, api_key) of a fresh tenant."""
    tenant = create_tenant("acme", "interactive")
    return tenant, create_api_key(tenant).api_key


@pytest.fixture
def close_db_connections():
    yield
    connections.close_all()
