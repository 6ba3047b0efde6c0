"""The generation endpoints served straight from ASGI (inference/views/direct.py) answer as
Django's handler does: the same statuses, headers and bodies, side by side, for replies and
refusals; a client that disconnects cancels its request; everything else goes to Django.

Both applications are driven over ASGI as daphne drives them (a scope, the body as
`http.request` messages, `http.disconnect` when the client leaves), against the fake Triton
replica over real gRPC, with the real PostgreSQL and Redis."""
import asyncio
import json

import pytest

from inference.views.direct import DirectGeneration
from llm_platform.asgi_handler import InlineSignalsASGIHandler
from tests.support.platform import sse_events
from tests.support.waiting import async_wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.django_db(transaction=True)]

BODY = {"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
VOLATILE_HEADERS = {"x-request-id", "x-ratelimit-remaining-requests",
                    "x-ratelimit-remaining-tokens", "x-ratelimit-reset-requests",
                    "x-ratelimit-reset-tokens"}
VOLATILE_FIELDS = {"id", "created", "request_id"}


class Exchange:
    """One request over ASGI: what the application sent back."""

    def __init__(self, method: str, path: str, headers: dict, body: bytes,
                 chunk_size: int | None = None):
        self.scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "",
            "headers": [(k.lower().encode("latin1"), v.encode("latin1"))
                        for k, v in {"host": "testserver", **headers}.items()],
            "client": ("127.0.0.1", 40000), "server": ("testserver", 80)}
        self.inbox: asyncio.Queue = asyncio.Queue()
        pieces = [body] if not chunk_size else [body[i:i + chunk_size]
                                                for i in range(0, len(body), chunk_size)] or [b""]
        for index, piece in enumerate(pieces):
            self.inbox.put_nowait({"type": "http.request", "body": piece,
                                   "more_body": index < len(pieces) - 1})
        self.sent: list[dict] = []
        self.first_body = asyncio.Event()

    async def receive(self):
        return await self.inbox.get()

    async def send(self, message):
        self.sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            self.first_body.set()

    async def run(self, app):
        await app(self.scope, self.receive, self.send)
        return self

    @property
    def status(self) -> int:
        return self.sent[0]["status"]

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode().lower(): v.decode() for k, v in self.sent[0]["headers"]}

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent[1:])


def scrub(value):
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in VOLATILE_FIELDS}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def token_text(name, data: dict) -> str | None:
    """The text of a token event (native or chat format), else None."""
    if name == "token":
        return data["text"]
    choices = data.get("choices") or []
    if choices and choices[0].get("finish_reason") is None:
        content = (choices[0].get("delta") or {}).get("content")
        if content:
            return content
    return None


def stream_shape(payload: bytes):
    """The events with their volatile fields dropped and token events merged: tokens that
    arrive together leave together, so how they group varies from run to run."""
    events, text = [], []
    for name, data in sse_events(payload):
        if isinstance(data, dict):
            data = scrub(data)
            piece = token_text(name, data)
            if piece is not None:
                text.append(piece)
                if not events or events[-1] != ("tokens", name):
                    events.append(("tokens", name))
                continue
        events.append((name, data))
    return events, "".join(text)


def comparable(exchange: Exchange):
    headers = {k: ("<varies>" if k in VOLATILE_HEADERS else v)
               for k, v in exchange.headers.items()}
    if headers.get("content-type") == "text/event-stream":
        body = stream_shape(exchange.body)
    elif headers.get("content-type") == "application/json":
        body = scrub(json.loads(exchange.body))
    else:
        body = exchange.body
    return exchange.status, headers, body


def apps():
    django_app = InlineSignalsASGIHandler()
    return DirectGeneration(django_app), django_app


def request_cases(auth: dict) -> list[tuple[str, str, str, dict, bytes]]:
    json_headers = {"content-type": "application/json", **auth}
    body = json.dumps(BODY).encode()
    return [
        ("generate", "POST", "/v1/generate", json_headers, body),
        ("chat stream", "POST", "/v1/chat/completions", json_headers,
         json.dumps({**BODY, "stream": True, "stream_options": {"include_usage": True}}).encode()),
        ("completions", "POST", "/v1/completions", json_headers,
         json.dumps({"model": "chat-small", "prompt": "Hi", "max_tokens": 3}).encode()),
        ("malformed JSON", "POST", "/v1/generate", json_headers, b"{not json"),
        ("no key", "POST", "/v1/generate", {"content-type": "application/json"}, body),
        ("unknown model", "POST", "/v1/chat/completions", json_headers,
         json.dumps({**BODY, "model": "nope"}).encode()),
        ("bad parameter", "POST", "/v1/generate", json_headers,
         json.dumps({**BODY, "temperature": "hot"}).encode()),
        ("too large", "POST", "/v1/generate", json_headers, b" " * 5000 + body),
        ("wrong method", "GET", "/v1/generate", auth, b""),
        ("disallowed host", "POST", "/v1/generate", {**json_headers, "host": "evil.example"},
         body),
    ]


async def test_direct_path_answers_as_django_does(auth, ready_replica, settings, caplog):
    settings.API_MAX_BODY_BYTES = 4096
    direct, django_app = apps()

    def logged():  # the handler's line for a refusal (django.request), as operators read it
        lines = [(r.levelname, r.getMessage()) for r in caplog.records
                 if r.name.startswith("django.")]
        caplog.clear()
        return lines

    for name, method, path, headers, body in request_cases(auth):
        caplog.clear()
        via_django = comparable(await Exchange(method, path, headers, body).run(django_app))
        django_lines = logged()
        via_direct = comparable(await Exchange(method, path, headers, body).run(direct))
        assert via_direct == via_django, name
        assert logged() == django_lines, name
    # The cases cover replies and refusals alike (not two identical failures).
    statuses = [comparable(await Exchange(m, p, h, b).run(direct))[0]
                for _, m, p, h, b in request_cases(auth)]
    assert statuses == [200, 200, 200, 400, 401, 404, 400, 413, 405, 400]


async def test_direct_path_serves_the_request_itself_and_records_its_metrics(auth, ready_replica,
                                                                           monkeypatch):
    from inference.views import direct as direct_module

    served = []
    original = direct_module.record_response
    monkeypatch.setattr(direct_module, "record_response",
                        lambda route, method, response, elapsed: (
                            served.append((route, method, response.status_code)),
                            original(route, method, response, elapsed)))
    direct, _ = apps()
    body = json.dumps(BODY).encode()
    headers = {"content-type": "application/json", "x-request-id": "direct-path-req-1", **auth}
    # The body in several messages, as a client's chunks arrive.
    reply = await Exchange("POST", "/v1/generate", headers, body, chunk_size=7).run(direct)
    assert reply.status == 200, reply.body
    assert json.loads(reply.body)["text"] == " t0 t1 t2 t3"
    assert reply.headers["x-request-id"] == "direct-path-req-1"  # the client's id, claimed
    assert reply.headers["content-length"] == str(len(reply.body))
    assert served == [("/v1/generate", "POST", 200)]  # not Django's handler
    served.clear()
    # A stream's is recorded once, on the loop's turn after its first bytes left.
    stream = Exchange("POST", "/v1/generate", headers={**headers, "x-request-id": "direct-2"},
                      body=json.dumps({**BODY, "stream": True}).encode())
    running = asyncio.ensure_future(stream.run(direct))
    await stream.first_body.wait()
    assert served == []
    await running
    assert served == [("/v1/generate", "POST", 200)]
    served.clear()
    await Exchange("GET", "/v1/models", auth, b"").run(direct)
    assert served == []  # every other path is Django's


async def test_a_chat_streams_done_ends_the_body_in_the_same_message(auth, ready_replica):
    """`data: [DONE]` (a LastChunk) goes out with the body's end: one write on the lean
    server, not two; a native stream (no sentinel) ends with an empty message after its
    last event, as before. Either way the usage is recorded before the body ends."""
    direct, _ = apps()
    headers = {"content-type": "application/json", **auth}
    chat = await Exchange("POST", "/v1/chat/completions", headers, json.dumps(
        {**BODY, "stream": True}).encode()).run(direct)
    bodies = [m for m in chat.sent if m["type"] == "http.response.body"]
    assert bodies[-1] == {"type": "http.response.body", "body": b"data: [DONE]\n\n",
                          "more_body": False}
    assert all(m["more_body"] for m in bodies[:-1]) and len(bodies) >= 2
    native = await Exchange("POST", "/v1/generate", headers, json.dumps(
        {**BODY, "stream": True}).encode()).run(direct)
    bodies = [m for m in native.sent if m["type"] == "http.response.body"]
    assert bodies[-1] == {"type": "http.response.body"} and bodies[-2]["body"]
    assert all(m["more_body"] for m in bodies[:-1])


async def test_a_client_that_disconnects_mid_stream_cancels_its_request(auth, ready_replica,
                                                                        fake_replica):
    direct, _ = apps()
    body = {**BODY, "stream": True, "max_tokens": 200,
            "messages": [{"role": "user", "content": "[slow] tell me"}]}
    exchange = Exchange("POST", "/v1/generate", {"content-type": "application/json", **auth},
                        json.dumps(body).encode())
    served = asyncio.create_task(exchange.run(direct))
    await asyncio.wait_for(exchange.first_body.wait(), 10)
    exchange.inbox.put_nowait({"type": "http.disconnect"})
    done, _ = await asyncio.wait({served}, timeout=5)  # the stream would take 10 s
    if not done:
        served.cancel()
    assert done, "the request went on after its client left"
    request_id = fake_replica.state.requests[-1]["request_id"]
    await async_wait_until(lambda: fake_replica.state.usage[request_id]["state"] == "finished",
                           10, "the replica's generation ended")
    assert fake_replica.state.usage[request_id]["output_tokens"] < 100  # aborted, not finished
    assert exchange.sent[-1].get("more_body") is True  # no final message: nobody reads it


async def test_a_client_that_leaves_before_its_body_is_not_answered(auth, ready_replica,
                                                                    fake_replica):
    direct, _ = apps()
    exchange = Exchange("POST", "/v1/generate", {"content-type": "application/json", **auth},
                        b"")
    exchange.inbox = asyncio.Queue()
    exchange.inbox.put_nowait({"type": "http.request", "body": b'{"model":', "more_body": True})
    exchange.inbox.put_nowait({"type": "http.disconnect"})
    await asyncio.wait_for(exchange.run(direct), 10)
    assert exchange.sent == [] and fake_replica.state.requests == []
