"""The OpenAPI 3.1 document: served at /v1/openapi.json, valid, derived from the serializers,
and real replies (success and error) match its schemas."""
import json
from datetime import datetime, timedelta, timezone

import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from inference import schemas
from inference.openapi.document import build_document
from inference.openapi.fields import serializer_schema

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


def check(document: dict, component: str, instance) -> None:
    schema = {"$ref": f"#/components/schemas/{component}", "components": document["components"]}
    errors = list(Draft202012Validator(schema).iter_errors(instance))
    assert not errors, [e.message for e in errors]


async def test_document_is_valid_openapi_3_1(client):
    response = await client.get("/v1/openapi.json")
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    validate(document)
    assert {"/v1/generate", "/v1/chat/completions", "/v1/completions", "/v1/models",
            "/v1/models/{model_id}", "/v1/usage", "/health"} <= set(document["paths"])


async def test_request_schemas_are_the_serializers():
    components = build_document()["components"]["schemas"]
    assert components["ChatCompletionRequest"] == serializer_schema(schemas.ChatSerializer)
    chat = components["ChatCompletionRequest"]
    assert set(chat["properties"]) == set(schemas.ChatSerializer().fields)
    assert chat["required"] == ["model", "messages"]
    assert chat["properties"]["temperature"]["maximum"] == 2.0
    assert chat["properties"]["messages"]["items"]["properties"]["role"]["enum"] == list(
        schemas.ROLES)
    for body in (CHAT, {**CHAT, "stop": ["a", "b"], "stream": True,
                        "stream_options": {"include_usage": True}, "seed": None}):
        check(build_document(), "ChatCompletionRequest", body)


async def test_real_replies_match_the_document(client, auth, ready_replica):
    document = build_document()

    async def post(path, body):
        response = await client.post(path, data=json.dumps(body),
                                     content_type="application/json", headers=auth)
        return response.status_code, response.json()

    assert (await post("/v1/generate", CHAT))[0] == 200
    check(document, "Generation", (await post("/v1/generate", CHAT))[1])
    check(document, "ChatCompletion", (await post("/v1/chat/completions", CHAT))[1])
    check(document, "Completion", (await post("/v1/completions", {
        "model": "chat-small", "prompt": "Hi", "max_tokens": 2}))[1])
    check(document, "ModelList", (await client.get("/v1/models", headers=auth)).json())
    check(document, "Model", (await client.get("/v1/models/chat-small", headers=auth)).json())
    now = datetime.now(timezone.utc)
    usage = await client.get("/v1/usage", {"start": (now - timedelta(days=1)).isoformat(),
                                           "end": now.isoformat()}, headers=auth)
    check(document, "Usage", usage.json())
    for status, body in [await post("/v1/chat/completions", {"model": "chat-small"}),
                         await post("/v1/chat/completions", {**CHAT, "model": "nope"})]:
        assert status in (400, 404)
        check(document, "Error", body)
