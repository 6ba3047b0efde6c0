"""The bytes of a reply: its head and its chunked framing. Pure functions of what the
application sent and what the request allows; `DateHeader` formats `date` once a second."""
from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus
from operator import itemgetter
from typing import NamedTuple

STATUS_LINES = {status.value: b"HTTP/1.1 %d %s\r\n" % (status.value, status.phrase.encode())
                for status in HTTPStatus}
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


def status_line(status: int) -> bytes:
    line = STATUS_LINES.get(status)
    return line if line is not None else b"HTTP/1.1 %d Unknown\r\n" % status


def has_body(status: int, head_only: bool) -> bool:
    """Whether a reply with this status (to a HEAD request or not) carries body bytes."""
    return not head_only and status >= 200 and status not in (204, 304)


def chunk(body: bytes, last: bool = False) -> bytes:
    """`body` as one chunk of a chunked body (nothing for no bytes), the last chunk after it
    if `last`."""
    framed = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
    return framed + LAST_CHUNK if last else framed


class DateHeader:
    """`date: ...\\r\\n` for now, formatted once a second."""

    def __init__(self):
        self._second = 0
        self._line = b""

    def __call__(self) -> bytes:
        now = int(time.time())
        if now != self._second:
            self._second = now
            self._line = b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n"
        return self._line


class Head(NamedTuple):
    data: bytes  # status line, headers, blank line
    chunked: bool  # the body goes out in chunks
    keep_alive: bool  # the connection serves another request after this reply


def reply_head(status: int, headers, *, length: int | None, http_1_1: bool, keep_alive: bool,
               server: bytes, date: bytes) -> Head:
    """The head of a reply. `headers`: the application's, pairs of bytes (or bytes-like
    objects: a bytearray is taken as its bytes; a str or a number is a TypeError), CR and LF replaced so that no header can split the reply; `length`: a whole
    reply's body size (None: a stream, chunked on HTTP/1.1, else ended by closing the
    connection); `keep_alive`: what the request allows (a `connection: close` of the app's
    turns it off); `server`, `date`: header lines added when the app sent none.

    The common case (no colon in a name, no CR or LF anywhere, none of the names acted on:
    content-length, connection, transfer-encoding, server, date) is checked on the joined
    lines at once, in C, instead of a dozen Python steps a header (a stream's 14 headers:
    12.2 -> 4.7 us on the Xeon of round frontdoor19, on the first token's way out); anything
    else takes the header by header path, which gives the same bytes."""
    if type(headers) is not list and type(headers) is not tuple:
        headers = list(headers)  # an iterator: read once, looked at twice
    parts = [status_line(status)]
    lines = _plain_lines(headers)
    if lines is None:
        has_length, has_server, has_date, chunked_by_app, keep_alive = _each_header(
            headers, parts, keep_alive)
    else:
        parts.append(lines)
        has_length = has_server = has_date = chunked_by_app = False
    add = parts.append
    chunked = False
    if not has_length and not chunked_by_app and has_body(status, False):
        if length is not None:
            add(b"content-length: %d\r\n" % length)
        elif http_1_1:
            chunked = True
            add(b"transfer-encoding: chunked\r\n")
        else:
            keep_alive = False  # the end of the body is the end of the connection
    if not has_server and server:
        add(server)
    if not has_date:
        add(date)
    if not keep_alive:
        add(b"connection: close\r\n")
    add(b"\r\n")
    return Head(b"".join(parts), chunked, keep_alive)


# Lower-cased names reply_head acts on; `\n` before and `:` after, as in "\n" + the lines.
_WATCHED = (b"\ncontent-length:", b"\nconnection:", b"\ntransfer-encoding:", b"\nserver:",
            b"\ndate:")


_first = itemgetter(0)


def _plain_lines(headers) -> bytes | None:
    """The headers' lines joined, if none needs a look of its own (see reply_head), else
    None. Each line has exactly one CR and one LF, so counting them finds any in a name or a
    value; the names joined show any colon of theirs. Names and values are taken as
    bytes-like (a str fails the format: the header by header path then says why)."""
    try:
        lines = [b"%s: %s\r\n" % (name, value) for name, value in headers]
    except TypeError:
        return None
    count = len(lines)
    block = b"".join(lines)
    if block.count(b"\n") != count or block.count(b"\r") != count:
        return None
    if b":" in b"".join(map(_first, headers)):
        return None
    probe = b"\n" + block.lower()
    for watched in _WATCHED:
        if watched in probe:
            return None
    return block


def _each_header(headers, parts: list, keep_alive: bool) -> tuple[bool, bool, bool, bool, bool]:
    """reply_head's header by header path: each header checked, made safe and added to
    `parts`; (has_length, has_server, has_date, chunked_by_app, keep_alive)."""
    add = parts.append
    has_length = has_server = has_date = chunked_by_app = False
    for name, value in headers:
        if type(name) is not bytes or type(value) is not bytes:
            raise TypeError(f"Header {name!r}: {value!r}: names and values must be bytes")
        lowered = name.lower()
        if lowered == b"content-length":
            has_length = True
        elif lowered == b"connection":
            if b"close" in value.lower():
                keep_alive = False
        elif lowered == b"transfer-encoding":
            chunked_by_app = True
        elif lowered == b"server":
            has_server = True
        elif lowered == b"date":
            has_date = True
        if b"\n" in value or b"\r" in value:
            value = value.replace(b"\r", b" ").replace(b"\n", b" ")
        if b"\n" in name or b"\r" in name or b":" in name:
            name = name.replace(b"\r", b"").replace(b"\n", b"").replace(b":", b"")
        add(name)
        add(b": ")
        add(value)
        add(b"\r\n")
    return has_length, has_server, has_date, chunked_by_app, keep_alive
