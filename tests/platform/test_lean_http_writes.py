"""How llm_platform.lean_http writes a reply: straight to the socket while Twisted's transport
holds nothing unsent, else through the transport (order and backpressure kept). Against
Twisted's real TCP transport over a socket pair, with a reactor that only records what it is
asked to watch (pure logic; the wire behaviour is in tests/e2e/test_lean_http.py)."""
from __future__ import annotations

import socket
from types import SimpleNamespace

from twisted.internet import tcp

from llm_platform.lean_http.connection import LeanHTTPProtocol


class RecordingReactor:
    """What a reactor is asked to watch for writability (a set, as a real reactor's)."""

    def __init__(self):
        self.writers = []

    def addWriter(self, writer):
        if writer not in self.writers:
            self.writers.append(writer)

    def removeWriter(self, writer):
        if writer in self.writers:
            self.writers.remove(writer)

    def addReader(self, reader):
        pass

    def removeReader(self, reader):
        pass


def connection():
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    reactor = RecordingReactor()
    transport = tcp.Connection(ours, None, reactor)
    transport.connected = True
    conn = SimpleNamespace(_socket=ours, transport=transport)
    return conn, transport, reactor, peer


def write(conn, data: bytes) -> None:
    LeanHTTPProtocol.write(conn, data)


def read_all(peer: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        data += peer.recv(size - len(data))
    return data


def test_a_write_goes_straight_to_the_socket_without_the_reactor():
    conn, transport, reactor, peer = connection()
    write(conn, b"HTTP/1.1 200 OK\r\n\r\n")
    write(conn, b"more")
    assert read_all(peer, 23) == b"HTTP/1.1 200 OK\r\n\r\nmore"
    assert reactor.writers == [] and transport.dataBuffer == b"" and not transport._tempDataBuffer


def test_what_the_socket_does_not_take_waits_in_the_transport_and_later_writes_queue_behind():
    conn, transport, reactor, peer = connection()
    big = bytes(range(256)) * 8192  # 2 MiB: more than the socket pair's buffers
    write(conn, big)
    assert reactor.writers == [transport]  # the rest waits for writability
    buffered = len(transport.dataBuffer) + transport._tempDataLen
    assert 0 < buffered < len(big)
    write(conn, b"tail")  # behind the buffered bytes, not before them
    assert transport._tempDataBuffer[-1] == b"tail"
    received = read_all(peer, len(big) - buffered)
    while transport.dataBuffer or transport._tempDataBuffer:
        transport.doWrite()
        received += peer.recv(1 << 20)
    received += read_all(peer, len(big) + 4 - len(received))
    assert received == big + b"tail"
    assert reactor.writers == []  # all written: the reactor no longer watches the socket


def test_a_closed_peer_leaves_the_error_to_the_transport():
    conn, transport, reactor, peer = connection()
    peer.close()
    write(conn, b"x" * 100_000)  # EPIPE or a reset: nothing raised here
    assert reactor.writers == [transport]  # the transport's own write finds the error


def test_a_tls_connection_is_written_through_its_transport():
    conn, transport, reactor, peer = connection()
    conn._socket = None  # what connectionMade keeps for a TLS transport
    write(conn, b"secret")
    assert transport._tempDataBuffer == [b"secret"] and reactor.writers == [transport]
