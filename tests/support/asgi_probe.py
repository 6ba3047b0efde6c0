"""A small ASGI app for the HTTP protocol tests (tests/e2e/test_lean_http.py): it answers what
the server handed it, and keeps a log of what it saw (`GET /events`), so a test can wait on
what happened inside the server (a disconnect, a blocked send) rather than on time.

- `POST|GET /echo`: the whole body read, then JSON: the scope's fields and the body's size;
- `GET /stream?n=N`: N chunks of `chunk <i>\\n`;
- `GET /hold?id=X`: one chunk, then waits for `http.disconnect` (logs `X disconnect`);
- `GET /flood?id=X`: 64 KiB chunks, 8 MiB in all, logging `X blocked <bytes sent>` the first
  time a send is still waiting after half a second, `X done` at the end;
- `GET /boom`, `/boom-mid`, `/no-reply`, `/str-header`: an application that fails before,
  during, or without a reply, or sends a header that is not bytes;
- `GET /crlf-header`: header values and names with CR LF in them (a reply split in two);
- `GET /events`: the log, as JSON; a WebSocket at any path echoes text frames.
"""
from __future__ import annotations

import asyncio
import json
from urllib.parse import parse_qs

EVENTS: list[str] = []
FLOOD_CHUNK = b"f" * 65536
FLOOD_CHUNKS = 128


async def _json(send, payload, status: int = 200) -> None:
    body = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return body
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body


async def _websocket(scope, receive, send) -> None:
    message = await receive()
    assert message["type"] == "websocket.connect"
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        await send({"type": "websocket.send", "text": "echo " + message.get("text", "")})


async def app(scope, receive, send) -> None:
    if scope["type"] == "websocket":
        return await _websocket(scope, receive, send)
    if scope["type"] != "http":
        return
    path = scope["path"]
    query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    if path == "/events":
        return await _json(send, EVENTS)
    body = await _read_body(receive)
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain")]})
        for i in range(int(query.get("n", 3))):
            await send({"type": "http.response.body", "body": b"chunk %d\n" % i,
                        "more_body": True})
        await send({"type": "http.response.body", "body": b""})
    elif path == "/hold":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"held\n", "more_body": True})
        message = await receive()
        EVENTS.append(f"{query['id']} {message['type']}")
    elif path == "/flood":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        sent = 0
        blocked = False
        for _ in range(FLOOD_CHUNKS):
            sending = asyncio.ensure_future(send({"type": "http.response.body",
                                                  "body": FLOOD_CHUNK, "more_body": True}))
            done, _ = await asyncio.wait({sending}, timeout=0.5)
            if not done and not blocked:
                blocked = True
                EVENTS.append(f"{query['id']} blocked {sent}")
            await sending
            sent += len(FLOOD_CHUNK)
        await send({"type": "http.response.body", "body": b""})
        EVENTS.append(f"{query['id']} done")
    elif path == "/boom":
        raise RuntimeError("the probe fails before replying")
    elif path == "/boom-mid":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("the probe fails mid-reply")
    elif path == "/no-reply":
        return
    elif path == "/crlf-header":  # an app that would split its own reply
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"x-echo", b"a\r\nx-injected: yes\r\n\r\nbody"),
                                (b"x-bad\r\nx-injected-name", b"b")]})
        await send({"type": "http.response.body", "body": b"ok"})
    elif path == "/str-header":
        await send({"type": "http.response.start", "status": 200,
                    "headers": [("content-type", "text/plain")]})
        await send({"type": "http.response.body", "body": b"never"})
    else:
        await _json(send, {
            "method": scope["method"], "path": path, "raw_path": scope["raw_path"].decode(),
            "query_string": scope["query_string"].decode(),
            "http_version": scope["http_version"], "scheme": scope["scheme"],
            "root_path": scope["root_path"], "client": scope["client"],
            "headers": [[n.decode(), v.decode("latin-1")] for n, v in scope["headers"]],
            "body_size": len(body), "body_head": body[:64].decode("latin-1"),
        })
