"""Oversized request heads get a 4xx from daphne, never a dropped connection.

daphne reads HTTP through Twisted's `HTTPChannel`, which caps a request head at 500 header
lines and 16 KiB in all (`maxHeaders`, `totalHeadersSize`) and answers a bare `400 Bad
Request` over either. One case fell through: a single line (the request line or one header)
longer than `MAX_LENGTH` (16 KiB) reaches `LineReceiver.lineLengthExceeded`, whose default
drops the connection without a word. `answer_overlong_lines` overrides that hook (Twisted's
documented way to handle it) so that such a request gets `431 Request Header Fields Too Large`
with an OpenAI-style JSON body.

Heads within those limits reach the app, which validates what it reads (Authorization,
Idempotency-Key, X-Conversation-Id): a 4xx or a normal reply.
"""
from __future__ import annotations

import json

from twisted.web.http import HTTPChannel

_BODY = json.dumps({"error": {
    "message": f"A request header line (or the request line) is over {HTTPChannel.MAX_LENGTH} "
               "bytes.",
    "type": "invalid_request_error",
    "code": "request_header_too_large",
}}).encode()
REPLY = (b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
         b"Content-Type: application/json\r\nConnection: close\r\n"
         b"Content-Length: " + str(len(_BODY)).encode() + b"\r\n\r\n" + _BODY)


def _discard(data: bytes) -> None:
    pass


def _line_length_exceeded(channel: HTTPChannel, line: bytes) -> None:
    channel.transport.write(REPLY)
    # Half-close: the reply and a FIN go out while the rest of what the client sends is read
    # and dropped (closing with unread input sends a reset, which can destroy the reply in
    # flight). The channel's idle timeout (a minute) ends a client that never stops.
    channel.dataReceived = _discard
    close_write = getattr(channel.transport, "loseWriteConnection", None)
    (close_write or channel.transport.loseConnection)()


def answer_overlong_lines() -> None:
    """Idempotent; called where daphne loads the ASGI application."""
    HTTPChannel.lineLengthExceeded = _line_length_exceeded


class _BodyAsIs:
    """daphne's request without Twisted's form parsing: the body goes to the app as it came."""


def leave_bodies_to_the_app() -> None:
    """Twisted parses a POST body of a form type into `request.args` before daphne sees it,
    and reads every POST's Content-Type through the email package to decide (~2 % of a short
    API request's CPU); daphne never reads `args` (it hands the app the raw body, which Django
    parses itself). daphne's requests are made with `parsePOSTFormSubmission=False` (Twisted's
    own switch), so a malformed multipart body reaches the app too (a JSON 4xx from the API)
    instead of Twisted's bare 400. Idempotent; called where daphne loads the ASGI application."""
    from daphne import http_protocol

    if issubclass(http_protocol.WebRequest, _BodyAsIs):
        return

    class WebRequest(_BodyAsIs, http_protocol.WebRequest):
        def __init__(self, *args, **kwargs):
            kwargs["parsePOSTFormSubmission"] = False
            super().__init__(*args, **kwargs)

    http_protocol.WebRequest = WebRequest  # HTTPFactory.buildProtocol reads it per connection
