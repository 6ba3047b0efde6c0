"""Oversized request heads get a 4xx, never a dropped connection.

The limits are Twisted's `HTTPChannel`'s, the same whichever HTTP protocol daphne runs
(llm_platform.lean_http by default, Twisted's own with API_HTTP_PROTOCOL=daphne): a request head
of at most 500 header lines and 16 KiB in all (`maxHeaders`, `totalHeadersSize`), each line at
most `MAX_LENGTH` (16 KiB). A line over that gets `431 Request Header Fields Too Large`, a head
over the others a `400`, both with an OpenAI-style JSON body (`json_error_reply`).

Twisted's own protocol needed two changes for that: a single overlong line reached
`LineReceiver.lineLengthExceeded`, whose default drops the connection without a word
(`answer_overlong_lines` overrides that hook, Twisted's documented way to handle it), and it
parsed form bodies itself (`leave_bodies_to_the_app`). daphne's protocol still serves WebSocket
upgrades, so both stay in force.

Heads within those limits reach the app, which validates what it reads (Authorization,
Idempotency-Key, X-Conversation-Id): a 4xx or a normal reply.
"""
from __future__ import annotations

from http import HTTPStatus

import orjson
from twisted.web.http import HTTPChannel

HEAD_LINE_LIMIT = HTTPChannel.MAX_LENGTH
HEAD_TOTAL_LIMIT = HTTPChannel.totalHeadersSize
MAX_HEADER_LINES = HTTPChannel.maxHeaders


def json_error_reply(status: int, code: str, message: str) -> bytes:
    """A whole HTTP/1.1 reply with an OpenAI-style error body, after which the connection
    closes (the HTTP layer's own refusals: nothing of the app's, so not inference's ApiError)."""
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error"
                                   if status < 500 else "server_error", "code": code}})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % (
                status, HTTPStatus(status).phrase.encode(), len(body))) + body


REPLY = json_error_reply(
    431, "request_header_too_large",
    f"A request header line (or the request line) is over {HEAD_LINE_LIMIT} bytes.")
HEAD_TOO_LARGE_REPLY = json_error_reply(
    400, "request_head_too_large",
    f"The request head is over {HEAD_TOTAL_LIMIT} bytes or {MAX_HEADER_LINES} header lines.")


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
