"""A TCP proxy in a thread that a test can take down (listener closed, every connection cut:
the server looks gone), bring back up on the same port, or freeze (connections stay open,
nothing is forwarded: the server looks hung, like a SIGSTOPped one) and thaw: PostgreSQL's
faults for tests/e2e/test_database_faults.py without touching the shared server."""
from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time

from scripts.services import free_port


class TcpProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._frozen = threading.Event()
        self._thread: threading.Thread | None = None

    def up(self) -> "TcpProxy":
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        self._stop.clear()
        self._thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        self._thread.start()
        return self

    def down(self) -> None:
        """Refuse new connections and cut every open one."""
        self._stop.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
        if self._thread is not None:
            self._thread.join(5)
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def freeze(self) -> None:
        self._frozen.set()

    def thaw(self) -> None:
        self._frozen.clear()

    def _accept(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, server}
            threading.Thread(target=self._pipe, args=(client, server), daemon=True).start()

    def _pipe(self, a: socket.socket, b: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        peers = {a: b, b: a}
        try:
            for sock in peers:
                sock.setblocking(True)
                selector.register(sock, selectors.EVENT_READ)
            while not self._stop.is_set():
                if self._frozen.is_set():  # hold every byte, in both directions
                    time.sleep(0.05)  # the fake's behaviour: a frozen link
                    continue
                for key, _ in selector.select(timeout=0.1):
                    data = key.fileobj.recv(65536)
                    if not data:
                        return
                    peers[key.fileobj].sendall(data)
        except (OSError, ValueError):
            return
        finally:
            selector.close()
            for sock in peers:
                with contextlib.suppress(OSError):
                    sock.close()
            with self._lock:
                self._sockets -= set(peers)
