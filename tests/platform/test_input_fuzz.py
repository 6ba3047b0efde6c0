"""A property-based fuzz of request bodies and headers: no case gets a 5xx.

Hypothesis builds bodies for /v1/chat/completions, /v1/completions, /v1/generate and the
/v1/stream WebSocket. A third are clean (valid values, OpenAI no-ops, a valid key): those must
be served, 200. The rest are mostly well-formed with some fields junk (wrong types, out of range,
lone surrogates, OpenAI parameters the platform does not implement), then serialized plainly
or mangled as raw text (deep nesting, thousand-digit integers, NaN/1e400, truncation, bytes
that are not UTF-8), with junk or oversized headers. Through the real ASGI app (Django's async
test client, channels' communicator) and a fake Triton replica: every reply is a 2xx whose
stream ends cleanly, or a 4xx with an OpenAI-style error body. A failure prints the
shrunk example that reproduces it. Bounded for CI: 200 examples, about 30 s.
"""
import asyncio
import json
import uuid
from dataclasses import dataclass

import pytest
from channels.testing import WebsocketCommunicator
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_platform.asgi import application
from tenants.models import Tenant

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

MAX_EXAMPLES = 200
EXAMPLE_TIMEOUT_S = 60
ROUTES = {"chat": "/v1/chat/completions", "completions": "/v1/completions",
          "generate": "/v1/generate", "websocket": "/v1/stream"}
OPENAI_PARAMS = [  # every chat/completions parameter the platform does not implement
    "audio", "best_of", "echo", "frequency_penalty", "function_call", "functions", "logit_bias",
    "logprobs", "metadata", "modalities", "moderation", "parallel_tool_calls", "prediction",
    "presence_penalty", "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
    "reasoning_effort", "response_format", "safety_identifier", "service_tier", "store",
    "suffix", "tool_choice", "tools", "top_logprobs", "user", "verbosity", "web_search_options",
]
NO_OP_VALUES = [None, False, 0, 0.0, 1, "", "none", "auto", "text", [], {}, ["text"],
                {"type": "text"}, {"type": "json_object"}, "u-1"]
SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])


def mostly(valid, bad):
    """`valid` three times in four, else `bad`."""
    return st.sampled_from([valid, valid, valid, bad]).flatmap(lambda strategy: strategy)


# Valid values: a clean body of them is served (200), whatever they are.
# No lone surrogates (category Cs): the API rightly refuses them, so they belong to the junk below.
clean_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
clean_content = clean_text | st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": clean_text}), max_size=2)
clean_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]),
     "content": clean_content},
    optional={"refusal": st.none(), "tool_calls": st.just([])})
native_stream_options = st.none() | st.fixed_dictionaries(
    {}, optional={"include_usage": st.booleans()})
clean_sampling = {
    "max_tokens": st.integers(1, 8),
    "temperature": st.none() | st.floats(0, 2),
    "top_p": st.none() | st.floats(0, 1, exclude_min=True),
    "seed": st.none() | st.integers(-(2**63), 2**63 - 1),
    "stop": st.none() | clean_text.filter(bool)
            | st.lists(clean_text.filter(bool), max_size=4),
    "stream": st.none() | st.booleans(),
    "stream_options": st.none() | st.fixed_dictionaries(
        {}, optional={"include_usage": st.booleans(), "include_obfuscation": st.just(False)}),
    "n": st.none() | st.just(1),
}
shared_no_ops = {"user": clean_text, "logprobs": st.just(False), "presence_penalty": st.just(0),
                 "frequency_penalty": st.just(0.0), "logit_bias": st.just({})}
no_op_extras = {
    "chat": st.fixed_dictionaries({}, optional={
        **shared_no_ops, "tools": st.just([]), "response_format": st.just({"type": "text"}),
        "store": st.just(False)}),
    "completions": st.fixed_dictionaries({}, optional={
        **shared_no_ops, "best_of": st.just(1), "suffix": st.just("")}),
}
clean_bodies = {
    "chat": st.fixed_dictionaries(
        {"model": st.just("chat-small"), "messages": st.lists(clean_message, min_size=1,
                                                              max_size=3)},
        optional={**clean_sampling, "max_completion_tokens": st.integers(1, 8)}),
    "completions": st.fixed_dictionaries(
        {"model": st.just("chat-small"), "prompt": clean_text.filter(bool)},
        optional={**clean_sampling, "echo": st.just(False)}),
}
clean_bodies["generate"] = clean_bodies["websocket"] = st.fixed_dictionaries(
    {"model": st.just("chat-small"), "messages": st.lists(clean_message.filter(
        lambda m: set(m) == {"role", "content"}), min_size=1, max_size=3)},
    optional={**clean_sampling, "stream_options": native_stream_options})

# Junk: wrong types, out of range, lone surrogates, parameters nobody declares.
text = st.text(st.characters() | SURROGATES, max_size=12)
latin1 = st.text(st.characters(max_codepoint=0xFF), max_size=40)
junk = st.recursive(
    st.none() | st.booleans() | st.integers() | st.integers(-(2**80), 2**80) | st.floats()
    | text,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(text, children, max_size=3),
    max_leaves=8)
content = mostly(clean_content, text | st.lists(st.fixed_dictionaries(
    {"type": st.just("text"), "text": text}) | junk, max_size=2) | junk)
message = st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(["system", "user", "assistant", "tool"]), junk),
     "content": content},
    optional={"name": text, "refusal": st.none() | junk, "tool_calls": st.just([]) | junk})
sampling = {
    "max_tokens": st.integers() | junk,
    "temperature": st.floats() | junk,
    "top_p": st.floats() | junk,
    "seed": st.integers(-(2**70), 2**70) | junk,
    "stop": text | st.lists(text, max_size=6) | junk,
    "stream": junk,
    "stream_options": st.fixed_dictionaries(
        {}, optional={"include_usage": junk, "include_obfuscation": junk}) | junk,
    "n": st.integers() | junk,
}
sampling = {name: mostly(clean_sampling[name], bad) for name, bad in sampling.items()}
openai_extras = st.dictionaries(st.sampled_from(OPENAI_PARAMS),
                                st.sampled_from(NO_OP_VALUES) | junk, max_size=3)
model = mostly(st.just("chat-small"), st.just("nope") | text | junk)
chat_body = st.fixed_dictionaries(
    {"model": model, "messages": mostly(st.lists(message, min_size=1, max_size=3),
                                        st.lists(message, max_size=0) | junk)},
    optional={**sampling, "max_completion_tokens": st.integers(1, 8) | junk})
junk_bodies = {
    "chat": chat_body, "generate": chat_body, "websocket": chat_body,
    "completions": st.fixed_dictionaries(
        {"model": model, "prompt": mostly(text, st.lists(text, max_size=2) | junk)},
        optional={**sampling, "echo": st.booleans() | junk}),
}
RAW_VALUES = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "9" * 5000,
                              "-" + "9" * 4400, "1" + "0" * 400 + ".5", "1" * 120,
                              '"\\ud800"', '"\\udfff\\ud800"', "[" * 3000 + "]" * 3000])


@st.composite
def raw_body(draw, body) -> bytes:
    """`body` serialized, or mangled as raw bytes the way no JSON library would write it."""
    how = draw(st.sampled_from(["ascii", "utf8", "splice", "nest", "truncate", "bytes"]))
    plain = json.dumps(body)
    if how == "ascii":  # surrogates become \ud800 escapes
        return plain.encode()
    if how == "utf8":  # surrogates become (invalid) UTF-8 bytes
        return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
    if how == "splice" and plain.startswith("{") and len(plain) > 2:
        key = draw(st.sampled_from(["seed", "max_tokens", "temperature", "stop", "x"]))
        return (plain[:-1] + f', "{key}": {draw(RAW_VALUES)}}}').encode()
    if how == "nest":
        depth = draw(st.integers(1, 5000))
        return ('{"a": ' * depth + plain + "}" * depth).encode()
    if how == "truncate":
        return plain.encode()[:draw(st.integers(0, max(0, len(plain) - 1)))]
    return draw(st.binary(max_size=64)) + plain.encode()


@st.composite
def junk_headers(draw, api_key: str) -> dict[str, str]:
    authorization = draw(st.sampled_from(["valid", "valid", "valid", "junk", "none", "huge"]))
    headers = {}
    if authorization == "valid":
        headers["Authorization"] = f"Bearer {api_key}"
    elif authorization == "junk":
        headers["Authorization"] = draw(st.just("Bearer ") | st.just("")) + draw(latin1)
    elif authorization == "huge":
        headers["Authorization"] = f"Bearer {api_key}" + "x" * draw(st.integers(1, 70_000))
    for name in ("Idempotency-Key", "X-Conversation-Id"):
        choice = draw(st.sampled_from(["none", "none", "text", "huge"]))
        if choice == "text":
            headers[name] = draw(latin1)
        elif choice == "huge":
            headers[name] = "k" * draw(st.integers(200, 70_000))
    if draw(st.booleans()):
        headers["X-Junk"] = draw(latin1) * draw(st.integers(1, 2000))
    return headers


@dataclass(frozen=True)
class Case:
    route: str
    raw: bytes
    headers: dict
    clean: bool  # a valid body, plainly encoded, with a valid key: must be served (200)


@st.composite
def cases(draw, api_key: str) -> Case:
    route = draw(st.sampled_from(list(ROUTES)))
    if draw(st.integers(0, 2)) == 0:
        body = draw(clean_bodies[route])
        if route in ("chat", "completions"):
            body = {**body, **draw(no_op_extras[route])}
        headers = {"Authorization": f"Bearer {api_key}"}
        if draw(st.booleans()):  # a fresh key each time: a replay or a 422 is not a 200
            headers["Idempotency-Key"] = f"fuzz-{uuid.uuid4()}"
        return Case(route, json.dumps(body, ensure_ascii=draw(st.booleans())).encode(),
                    headers, clean=True)
    body = draw(junk_bodies[route])
    if route in ("chat", "completions") and draw(st.booleans()):
        body = {**body, **draw(openai_extras)}
    return Case(route, draw(raw_body(body)), draw(junk_headers(api_key)), clean=False)


def assert_error_body(status: int, body: dict) -> None:
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and isinstance(error["code"], str), body
    assert error.get("param") is None or isinstance(error["param"], str), body


async def over_http(client, case: Case) -> None:
    response = await client.post(ROUTES[case.route], data=case.raw,
                                 content_type="application/json", headers=case.headers)
    status = response.status_code
    assert status < 500, (status, response.content if not response.streaming else b"")
    assert status == 200 or not case.clean, response.content
    if status >= 400:
        assert 400 <= status < 500
        assert_error_body(status, json.loads(response.content))
        return
    if not response.streaming:
        assert "error" not in json.loads(response.content)
        return
    stream = b"".join([chunk async for chunk in response.streaming_content]).decode()
    lines = [line[6:] for line in stream.splitlines() if line.startswith("data: ")]
    assert lines, stream
    for data in lines:
        assert data == "[DONE]" or "error" not in json.loads(data), stream


async def over_websocket(case: Case) -> None:
    scope_headers = [(name.lower().encode(), value.encode("latin-1"))
                     for name, value in case.headers.items()]
    communicator = WebsocketCommunicator(application, ROUTES["websocket"], headers=scope_headers)
    connected, _ = await communicator.connect(timeout=10)
    assert connected
    try:
        try:  # send_input: send_to refuses an empty frame, which a client may send
            frame = {"text": case.raw.decode("utf-8")}
        except UnicodeDecodeError:
            frame = {"bytes": case.raw}
        await communicator.send_input({"type": "websocket.receive", **frame})
        while True:
            reply = await communicator.receive_json_from(timeout=EXAMPLE_TIMEOUT_S)
            if reply["type"] == "error":
                assert 400 <= reply["status"] < 500 and not case.clean, reply
                assert_error_body(reply["status"], reply)
                return
            if reply["type"] == "done":
                return
    finally:
        await communicator.disconnect()


async def test_no_request_gets_a_5xx(client, api_key, tenant, ready_replica):
    # Quotas out of the way: a 429 is a fine answer, but would hide the path behind it.
    await Tenant.objects.filter(pk=tenant.pk).aupdate(requests_per_minute=10**6,
                                                      tokens_per_minute=10**8)
    loop = asyncio.get_running_loop()

    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(case=cases(api_key))
    def no_5xx(case):
        request = over_websocket(case) if case.route == "websocket" else over_http(client, case)
        asyncio.run_coroutine_threadsafe(request, loop).result(timeout=EXAMPLE_TIMEOUT_S)

    # Hypothesis drives the examples from a thread; each runs on this test's event loop,
    # where the fake replica and the platform's clients live.
    await asyncio.to_thread(no_5xx)
