"""The head of a reply (llm_platform/lean_http/reply.py): pure logic; the same replies on the
wire are in tests/e2e/test_lean_http.py."""
from __future__ import annotations

import pytest

from llm_platform.lean_http.reply import chunk, has_body, reply_head, status_line

DATE = b"date: Thu, 03 Dec 2026 07:00:00 GMT\r\n"
SERVER = b"server: daphne\r\n"


def head(status=200, headers=(), **kwargs):
    options = dict(length=None, http_1_1=True, keep_alive=True, server=SERVER, date=DATE)
    options.update(kwargs)
    return reply_head(status, list(headers), **options)


def lines(data: bytes) -> list[bytes]:
    assert data.endswith(b"\r\n\r\n")
    return data[:-4].split(b"\r\n")


def test_a_whole_reply_gets_its_length_and_stays_open():
    done = head(headers=[(b"content-type", b"application/json")], length=12)
    assert lines(done.data) == [b"HTTP/1.1 200 OK", b"content-type: application/json",
                                b"content-length: 12", SERVER[:-2], DATE[:-2]]
    assert (done.chunked, done.keep_alive) == (False, True)


def test_a_stream_is_chunked_on_1_1_and_ends_the_connection_on_1_0():
    assert head().chunked and b"transfer-encoding: chunked" in lines(head().data)
    old = head(http_1_1=False)
    assert not old.chunked and not old.keep_alive
    assert b"connection: close" in lines(old.data)


def test_the_apps_own_headers_win():
    done = head(headers=[(b"Content-Length", b"3"), (b"Server", b"x"), (b"Date", b"d"),
                         (b"Connection", b"close")], length=3)
    assert lines(done.data) == [b"HTTP/1.1 200 OK", b"Content-Length: 3", b"Server: x",
                                b"Date: d", b"Connection: close", b"connection: close"]
    assert not done.keep_alive and not done.chunked


def test_no_body_statuses_get_no_framing():
    for status in (204, 304):
        assert not any(line.startswith((b"content-length", b"transfer-encoding"))
                       for line in lines(head(status).data))
        assert not has_body(status, head_only=False)
    assert not has_body(200, head_only=True) and has_body(200, head_only=False)


def test_cr_lf_cannot_split_the_head():
    done = head(headers=[(b"x-a", b"1\r\nx-injected: 2"), (b"x-b\r\nx-c:", b"3")], length=0)
    assert lines(done.data)[1:3] == [b"x-a: 1  x-injected: 2", b"x-bx-c: 3"]


def test_headers_must_be_bytes():
    with pytest.raises(TypeError):
        head(headers=[("content-type", "text/plain")], length=0)


def test_status_lines_and_chunks():
    assert status_line(429) == b"HTTP/1.1 429 Too Many Requests\r\n"
    assert status_line(299) == b"HTTP/1.1 299 Unknown\r\n"
    assert chunk(b"hello") == b"5\r\nhello\r\n"
    assert chunk(b"", last=True) == b"0\r\n\r\n"
    assert chunk(b"ab", last=True) == b"2\r\nab\r\n0\r\n\r\n"


def test_an_exchange_tells_its_watcher_once_when_its_connection_closes():
    """`watch_gone`: the direct path learns of a disconnect without a task waiting in
    `receive` (inference/views/direct.py); not after the reply's end, not once unwatched."""
    from llm_platform.lean_http.exchange import Exchange

    def exchange() -> Exchange:
        return Exchange(conn=None, scope={"method": "POST"}, keep_alive=True,
                        expect_continue=False)

    told: list[str] = []
    watched = exchange()
    watched.watch_gone(lambda: told.append("gone"))
    watched.close()
    watched.close()
    assert told == ["gone"] and watched.gone
    unwatched = exchange()
    unwatched.watch_gone(lambda: told.append("unwatched"))
    unwatched.watch_gone(None)
    unwatched.close()
    finished = exchange()
    finished.watch_gone(lambda: told.append("finished"))
    finished.finished = True
    finished.close()
    assert told == ["gone"] and unwatched.gone and finished.gone


def test_the_joined_lines_path_gives_the_header_by_header_bytes():
    """reply_head's fast path (the lines checked joined) against its header by header path,
    on heads either may take: the same bytes, chunking and keep-alive."""
    from llm_platform.lean_http import reply

    stream = [(b"Content-Type", b"text/event-stream"), (b"Cache-Control", b"no-cache"),
              (b"x-ratelimit-reset-tokens", b"0.6s"), (b"X-Request-ID", b"req_1"),
              (b"X-Frame-Options", b"DENY"), (b"Location", b"http://a:80/x")]
    cases = [stream, [], [(b"x-server", b"date: 1")], [(b"a", b"b")] * 3,
             [(b"Content-Length", b"3")], [(b"CONNECTION", b"Close")], [(b"x", b"1\r\n2")],
             [(b"x:y", b"1")], [(b"x\n", b"1")], [(b"Server", b"me")], [(b"DATE", b"d")],
             [(b"Transfer-Encoding", b"chunked")], [[b"as", b"list"]]]
    for headers in cases:
        for options in ({}, {"length": 7}, {"http_1_1": False}, {"keep_alive": False}):
            fast = head(headers=headers, **options)
            parts = [status_line(200)]
            has_length, has_server, has_date, chunked_by_app, keep_alive = reply._each_header(
                headers, parts, options.get("keep_alive", True))
            slow_flags = (has_length, has_server, has_date, chunked_by_app)
            if reply._plain_lines(headers) is not None:
                assert slow_flags == (False,) * 4  # the fast path is for heads acting on none
                assert b"".join(parts[1:]) == reply._plain_lines(headers)
            assert fast.data.startswith(b"".join(parts)), (headers, options)
    assert reply._plain_lines(stream) is not None  # the stream's own head takes the fast path
    for unplain in cases[4:12]:
        assert reply._plain_lines(unplain) is None, unplain


def test_headers_may_come_as_an_iterator():
    done = reply_head(200, iter([(b"content-type", b"text/plain")]), length=0, http_1_1=True,
                      keep_alive=True, server=SERVER, date=DATE)
    assert lines(done.data)[1] == b"content-type: text/plain"
