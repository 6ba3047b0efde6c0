"""Bad input gets a 4xx with an OpenAI-style body on every route, never a 500: deep nesting,
huge integers, non-finite numbers, lone surrogates, seeds outside 64 bits, OpenAI parameters
the platform does not implement, a suspended tenant (a limit of 0)."""
import json

import pytest
from channels.testing import WebsocketCommunicator

from llm_platform.asgi import application
from tenants.models import Tenant

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

CHAT = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
COMPLETIONS = {"model": "chat-small", "prompt": "Hi", "max_tokens": 4}
ROUTES = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETIONS, "/v1/generate": CHAT}


def with_raw(body: dict, key: str, raw_value: str) -> str:
    """`body` as JSON text with `"key": <raw_value>` spliced in verbatim (NaN, 1e400, ...)."""
    return json.dumps(body)[:-1] + f', "{key}": {raw_value}}}'


async def post(client, path, data, headers):
    if not isinstance(data, (str, bytes)):
        data = json.dumps(data)
    return await client.post(path, data=data, content_type="application/json", headers=headers)


def assert_error(response, status, code=None, param=None):
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["message"] and error["type"]
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error.get("param") == param, error
    return error


MALFORMED = {
    "deeply nested": "[" * 100_000 + "]" * 100_000,
    "nested past the depth limit": with_raw(CHAT, "x", "[" * 40 + "]" * 40),
    "5000-digit integer": with_raw(CHAT, "seed", "9" * 5000),
    "101-digit integer": with_raw(CHAT, "seed", "-" + "9" * 101),
    "NaN": with_raw(CHAT, "temperature", "NaN"),
    "Infinity": with_raw(CHAT, "temperature", "-Infinity"),
    "1e400": with_raw(CHAT, "top_p", "1e400"),
    "lone surrogate in content": json.dumps({**CHAT, "messages": [
        {"role": "user", "content": "hi \ud800 there"}]}),
    "lone surrogate in stop": json.dumps({**CHAT, "stop": ["\udfff"]}),
    "lone surrogate in a key": json.dumps({**CHAT, "\udc80": 1}),
    "invalid UTF-8": b'{"model": "chat-small", "messages": [{"role": "user", "content": "\xff"}]}',
    "UTF-8-encoded surrogate": '{"model": "\ud800"}'.encode("utf-8", "surrogatepass"),
}


@pytest.mark.parametrize("case", list(MALFORMED))
async def test_malformed_bodies_are_400(client, auth, model_version, case):
    for path in ROUTES:
        # An Idempotency-Key too: its fingerprint encodes the whole body.
        headers = {**auth, "Idempotency-Key": f"bad-{case}"}
        assert_error(await post(client, path, MALFORMED[case], headers), 400, "invalid_json")


async def test_lone_surrogate_in_a_completions_prompt_is_400(client, auth, model_version):
    body = json.dumps({**COMPLETIONS, "prompt": "\ud83d"})
    assert_error(await post(client, "/v1/completions", body, {**auth, "Idempotency-Key": "s"}),
                 400, "invalid_json")


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**64, 10**99])
async def test_seeds_outside_64_bits_are_400(client, auth, model_version, seed):
    assert_error(await post(client, "/v1/chat/completions", {**CHAT, "seed": seed}, auth), 400,
                 param="seed")


@pytest.mark.parametrize("seed", [2**63 - 1, -(2**63)])
async def test_seeds_at_the_64_bit_bounds_are_served(client, auth, ready_replica, seed):
    response = await post(client, "/v1/chat/completions", {**CHAT, "seed": seed}, auth)
    assert response.status_code == 200, response.content


@pytest.mark.parametrize("path,param,value", [
    ("/v1/chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}]),
    ("/v1/chat/completions", "tool_choice", "auto"),
    ("/v1/chat/completions", "response_format", {"type": "json_object"}),
    ("/v1/chat/completions", "logprobs", True),
    ("/v1/chat/completions", "top_logprobs", 3),
    ("/v1/chat/completions", "logit_bias", {"42": 5}),
    ("/v1/chat/completions", "frequency_penalty", 0.5),
    ("/v1/chat/completions", "presence_penalty", -1),
    ("/v1/chat/completions", "reasoning_effort", "high"),
    ("/v1/chat/completions", "service_tier", "flex"),
    ("/v1/chat/completions", "store", True),
    ("/v1/chat/completions", "user", 42),
    ("/v1/completions", "logprobs", 0),
    ("/v1/completions", "best_of", 2),
    ("/v1/completions", "suffix", "end"),
    ("/v1/completions", "frequency_penalty", 2),
])
async def test_unimplemented_openai_parameters_are_400_by_name(client, auth, model_version,
                                                                path, param, value):
    error = assert_error(await post(client, path, {**ROUTES[path], param: value}, auth), 400,
                         "unsupported_parameter", param)
    assert error["type"] == "invalid_request_error" and param in error["message"]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {**CHAT, "temprature": 0.5}, "temprature"),
    ("/v1/completions", {**COMPLETIONS, "messages": []}, "messages"),
    ("/v1/chat/completions", {**CHAT, "suffix": ""}, "suffix"),  # a completions parameter
    ("/v1/generate", {**CHAT, "user": "u1"}, "user"),  # the native endpoint: its own only
    ("/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "x",
                                                    "name": "bob"}]}, "messages.0.name"),
    ("/v1/chat/completions", {**CHAT, "stream": True,
                              "stream_options": {"include_obfuscation": True}},
     "stream_options.include_obfuscation"),
    ("/v1/chat/completions", {**CHAT, "stream_options": {"bogus": 1}}, "stream_options.bogus"),
])
async def test_parameters_nobody_declares_are_400_by_name(client, auth, model_version, path,
                                                          body, param):
    error = assert_error(await post(client, path, body, auth), 400, param=param)
    assert error["code"] in {"unknown_parameter", "unsupported_parameter"}


@pytest.mark.parametrize("path,extra", [
    ("/v1/chat/completions", {"user": "u-1", "n": 1, "logprobs": False, "top_logprobs": 0,
                              "frequency_penalty": 0, "presence_penalty": 0.0,
                              "logit_bias": {}, "tools": [], "tool_choice": "none",
                              "parallel_tool_calls": False, "response_format": {"type": "text"},
                              "store": False, "metadata": {"run": "a"},
                              "service_tier": "auto", "modalities": ["text"],
                              "prompt_cache_key": "k", "safety_identifier": "s"}),
    ("/v1/chat/completions", {"tools": None, "audio": None, "prediction": None,
                              "messages": [{"role": "user", "content": "Hi", "refusal": None,
                                            "tool_calls": []}],
                              "stream_options": {"include_usage": True,
                                                 "include_obfuscation": False},
                              "stream": True}),
    ("/v1/completions", {"user": "u-1", "logprobs": None, "best_of": 1, "suffix": "",
                         "echo": False, "presence_penalty": 0, "logit_bias": None}),
])
async def test_no_op_values_of_unimplemented_parameters_are_served(client, auth, ready_replica,
                                                                   path, extra):
    response = await post(client, path, {**ROUTES[path], **extra}, auth)
    assert response.status_code == 200, response.content


@pytest.mark.parametrize("limit", ["requests_per_minute", "tokens_per_minute", "request_burst",
                                   "token_burst"])
async def test_a_tenant_with_a_limit_of_0_is_403_suspended(client, auth, tenant, model_version,
                                                           limit):
    await Tenant.objects.filter(pk=tenant.pk).aupdate(**{limit: 0})
    for path, body in ROUTES.items():
        error = assert_error(await post(client, path, body, {**auth, "Idempotency-Key": path}),
                             403, "tenant_suspended")
        assert error["type"] == "invalid_request_error"
    # A refusal before admission (400) still reports the buckets, limit 0 and all.
    response = await post(client, "/v1/chat/completions", {**CHAT, "max_tokens": 0}, auth)
    assert_error(response, 400, param="max_tokens")
    assert response["x-ratelimit-limit-requests"] == str(0 if limit == "requests_per_minute"
                                                         else 600)


@pytest.mark.parametrize("authorization", ["Bearer llmp_\x00\x00\x00\x00\x00\x00\x00\x00_x",
                                           "Bearer llmp_abcdefgh_\x7f", "Bearer " + "k" * 8000])
async def test_junk_api_keys_are_401(client, model_version, authorization):
    assert_error(await post(client, "/v1/chat/completions", CHAT,
                            {"Authorization": authorization}), 401)


async def test_long_and_odd_idempotency_keys_are_400(client, auth, model_version):
    for key in ["k" * 256, "tab\there", "\x00"]:
        assert_error(await post(client, "/v1/chat/completions", CHAT,
                                {**auth, "Idempotency-Key": key}), 400, "invalid_idempotency_key")


async def ws_exchange(api_key: str, message: str) -> dict:
    communicator = WebsocketCommunicator(application, "/v1/stream")
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    try:
        await communicator.send_to(text_data=message)
        return await communicator.receive_json_from(timeout=10)
    finally:
        await communicator.disconnect()


@pytest.mark.parametrize("case", ["deeply nested", "5000-digit integer", "NaN",
                                  "lone surrogate in content", "lone surrogate in stop"])
async def test_websocket_refuses_malformed_messages(api_key, model_version, case):
    message = MALFORMED[case]
    if case != "deeply nested":
        message = message[:-1] + f', "api_key": "{api_key}", "idempotency_key": "ws-{case}"}}'
    reply = await ws_exchange(api_key, message)
    assert (reply["type"], reply["status"], reply["error"]["code"]) == ("error", 400,
                                                                        "invalid_json")


@pytest.mark.parametrize("extra,status,code", [
    ({"tools": [{"type": "function"}]}, 400, "unknown_parameter"),
    ({"seed": 2**64}, 400, "invalid_request"),
    ({"idempotency_key": 7}, 400, "invalid_request"),
])
async def test_websocket_refuses_what_http_refuses(api_key, model_version, extra, status, code):
    reply = await ws_exchange(api_key, json.dumps({**CHAT, "api_key": api_key, **extra}))
    assert (reply["type"], reply["status"], reply["error"]["code"]) == ("error", status, code)
    assert reply["error"]["param"] == next(iter(extra))


async def test_websocket_suspended_tenant_is_403(api_key, tenant, model_version):
    await Tenant.objects.filter(pk=tenant.pk).aupdate(tokens_per_minute=0)
    reply = await ws_exchange(api_key, json.dumps({**CHAT, "api_key": api_key}))
    assert (reply["status"], reply["error"]["code"]) == (403, "tenant_suspended")
