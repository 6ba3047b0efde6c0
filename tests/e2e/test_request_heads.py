"""Oversized request heads against a live daphne: always a 4xx, never a dropped connection.

Raw sockets, because HTTP clients refuse to send most of these heads themselves."""
import json
import socket
from urllib.parse import urlsplit

import pytest

from models_registry.services import ensure_model_version
from tenants.services import create_api_key, create_tenant

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BODY = json.dumps({"model": "chat-small", "messages": [{"role": "user", "content": "Hi"}],
                   "max_tokens": 2}).encode()


def exchange(base_url: str, header_lines: list[bytes], path: bytes = b"/v1/chat/completions"):
    """Send one POST with `header_lines`, read to EOF: (status, headers text, body bytes)."""
    url = urlsplit(base_url)
    head = [b"POST " + path + b" HTTP/1.1", b"Host: " + url.netloc.encode(),
            b"Content-Type: application/json", b"Connection: close", *header_lines,
            b"Content-Length: " + str(len(BODY)).encode()]
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + BODY)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    assert reply, "the server closed the connection without a reply"
    status_line, _, rest = reply.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), headers.decode("latin-1").lower(), body


def assert_json_error(headers: str, body: bytes, code: str) -> None:
    assert "content-type: application/json" in headers
    error = json.loads(body)["error"]
    assert error["code"] == code and error["message"] and error["type"]


@pytest.fixture
def key_header(transactional_db, live_server_url) -> bytes:
    # The Idempotency-Key is checked once the model is known (no replica needed for that).
    ensure_model_version("chat-small", 1, "fake", tokenizer="bytes", context_length=1024)
    key = create_api_key(create_tenant("heads", "interactive")).raw_key
    return b"Authorization: Bearer " + key.encode()


def test_one_header_line_over_16_kib_is_431(live_server_url, key_header):
    for size in (17_000, 1_000_000):  # the second is far more than the socket buffers hold
        status, headers, body = exchange(live_server_url,
                                         [key_header, b"X-Junk: " + b"j" * size])
        assert status == 431
        assert_json_error(headers, body, "request_header_too_large")


def test_a_request_line_over_16_kib_is_431(live_server_url, key_header):
    status, _, _ = exchange(live_server_url, [key_header],
                            path=b"/v1/chat/completions?q=" + b"q" * 20_000)
    assert status == 431


@pytest.mark.parametrize("lines", [
    [b"X-Junk-%d: %s" % (i, b"j" * 8000) for i in range(3)],  # 24 KB in all
    [b"X-Junk-%d: j" % i for i in range(600)],  # over Twisted's 500 headers
])
def test_a_head_over_twisteds_limits_is_400(live_server_url, key_header, lines):
    status, _, _ = exchange(live_server_url, [key_header, *lines])
    assert status == 400


def test_long_headers_within_the_limits_reach_the_app(live_server_url, key_header):
    status, headers, body = exchange(live_server_url,
                                     [key_header, b"Idempotency-Key: " + b"k" * 12_000])
    assert status == 400
    assert_json_error(headers, body, "invalid_idempotency_key")
    status, headers, body = exchange(live_server_url,
                                     [b"Authorization: Bearer " + b"k" * 12_000])
    assert status == 401
    assert_json_error(headers, body, "invalid_api_key")


def test_a_malformed_multipart_body_reaches_the_app(live_server_url, key_header):
    """Twisted does not parse form bodies (llm_platform.request_heads.leave_bodies_to_the_app):
    a body that claims to be multipart and is not gets the API's JSON answer, not Twisted's
    bare 400."""
    url = urlsplit(live_server_url)
    head = [b"POST /v1/chat/completions HTTP/1.1", b"Host: " + url.netloc.encode(),
            b"Content-Type: multipart/form-data; boundary=nothing-here", b"Connection: close",
            key_header, b"Content-Length: " + str(len(BODY)).encode()]
    with socket.create_connection((url.hostname, url.port), timeout=60) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + BODY)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    _, _, rest = reply.partition(b"\r\n")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in headers.lower(), reply[:500]
    assert json.loads(body)["error"]["message"]  # the API's answer (here: no replica ready)
