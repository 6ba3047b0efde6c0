"""A lean HTTP/1.1 client for the gateway benchmark: keep-alive connections and SSE parsing on
asyncio streams, a few microseconds of the client's CPU per event.

`benchmarks.gateway` measures what the platform adds against a zero-cost replica on one
machine, where the benchmark's own client shares the CPUs with the platform. httpx, reading
the platform's SSE line by line through h11, took 132-181 us of CPU per token (its direct side,
the platform's own gRPC client reading the replica, 68-171): CPU the platform side lost to its
client, not to the platform. This client reads what the platform sends with bytes operations
(chunked transfer coding, events split on blank lines): 12-34 us per token (benchmarks/
README.md, "frontdoor9"). `--client httpx` keeps the old measurement.

Not a general client: POST with a JSON body, HTTP/1.1 to one host, no TLS, no redirects, no
proxies.
"""
from __future__ import annotations

import asyncio
import json
from typing import Callable
from urllib.parse import urlsplit


class HttpError(Exception):
    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status
        self.body = body


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    async def head(self) -> tuple[int, dict[bytes, bytes]]:
        status_line = await self.reader.readuntil(b"\r\n")
        status = int(status_line.split(b" ", 2)[1])
        headers = {}
        while True:
            line = await self.reader.readuntil(b"\r\n")
            if line == b"\r\n":
                return status, headers
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()

    async def body_parts(self, headers: dict[bytes, bytes]):
        """The body as it arrives: chunked or Content-Length."""
        reader = self.reader
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":
                        pass  # trailers
                    return
                data = await reader.readexactly(size + 2)
                yield data[:-2]
        else:
            length = int(headers.get(b"content-length", b"0"))
            if length:
                yield await reader.readexactly(length)


class RawClient:
    """Keep-alive connections to one `base_url` (http://host:port), at most `max_connections`
    open; a connection serves one request at a time."""

    def __init__(self, base_url: str, max_connections: int = 64):
        parts = urlsplit(base_url)
        self._host, self._port = parts.hostname, parts.port or 80
        self._host_header = parts.netloc.encode()
        self._idle: list[_Connection] = []
        self._slots = asyncio.Semaphore(max_connections)

    async def _connection(self) -> _Connection:
        if self._idle:
            return self._idle.pop()
        reader, writer = await asyncio.open_connection(self._host, self._port)
        return _Connection(reader, writer)

    def _request(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [f"POST {path} HTTP/1.1".encode(), b"Host: " + self._host_header,
                 b"Content-Type: application/json", b"Content-Length: " + str(len(body)).encode()]
        lines += [f"{name}: {value}".encode() for name, value in headers.items()]
        return b"\r\n".join(lines) + b"\r\n\r\n" + body

    async def post(self, path: str, payload: dict, headers: dict[str, str],
                   on_event: Callable[[bytes, bytes], None] | None = None) -> bytes:
        """POST `payload` as JSON. Without `on_event`: the whole body. With it: the body read as
        SSE, `on_event(name, data)` called for each event as it arrives (name b"" for an
        unnamed event); returns b"". Raises HttpError for a status >= 400."""
        async with self._slots:
            conn = await self._connection()
            reusable = False
            try:
                conn.writer.write(self._request(path, json.dumps(payload).encode(), headers))
                status, head = await conn.head()
                if status >= 400 or on_event is None:
                    body = b"".join([part async for part in conn.body_parts(head)])
                    reusable = head.get(b"connection", b"").lower() != b"close"
                    if status >= 400:
                        raise HttpError(status, body)
                    return body
                pending = b""
                async for part in conn.body_parts(head):
                    pending += part
                    *events, pending = pending.split(b"\n\n")
                    for event in events:
                        name, data = b"", b""
                        for line in event.split(b"\n"):
                            if line.startswith(b"event: "):
                                name = line[7:]
                            elif line.startswith(b"data: "):
                                data = line[6:]
                        on_event(name, data)
                reusable = head.get(b"connection", b"").lower() != b"close"
                return b""
            finally:
                if reusable:
                    self._idle.append(conn)
                else:
                    conn.writer.close()

    async def aclose(self) -> None:
        for conn in self._idle:
            conn.writer.close()
        self._idle.clear()
