"""A TCP proxy in front of a web process whose connections a test can cut: a dropped connection, for real.

``DroppingProxy(upstream_port)`` forwards every connection to ``127.0.0.1:upstream_port``;
``drop()`` resets every connection open at that moment (both sides), as a network failure would;
``requests`` holds the head of every request that came through (to see e.g. ``Last-Event-ID``).
"""

from __future__ import annotations

import socket
import threading

from app.core.process import free_port

CHUNK = 65536


class DroppingProxy:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self.requests: list[str] = []
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(CHUNK):
                if record and data[:4] in (b"GET ", b"POST", b"DELE"):
                    with self._lock:
                        self.requests.append(data.decode("latin-1").split("\r\n\r\n")[0])
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                _close(sock)

    def drop(self) -> int:
        """Reset every open connection; returns how many there were."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                _close(sock)
        return len(pairs)

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self.drop()


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
