"""TCP proxies a test can break: ``TcpProxy``, the core (accept, forward each direction in a thread, cut every
open connection), and ``DroppingProxy``, the one in front of a web process whose connections a test cuts: a
dropped connection, for real. tests/soak/redisproxy.py's ``ReplyProxy`` is the Redis side's, on the same core.

``DroppingProxy(upstream_port)`` forwards every connection to ``127.0.0.1:upstream_port``;
``drop()`` resets every connection open at that moment (both sides), as a network failure would;
``requests`` holds the head of every request that came through (to see e.g. ``Last-Event-ID``).
"""

from __future__ import annotations

import socket
import threading

from app.core.process import free_port

CHUNK = 65536


class TcpProxy:
    """Listens on a free loopback port; each connection it accepts goes to ``_connect()``'s socket, client to
    upstream in ``_requests``, back in ``_replies`` (a thread each). A subclass sets what those need before
    ``__init__`` here starts accepting."""

    thread_name: str | None = None

    def __init__(self) -> None:
        self.port = free_port()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._closed = False
        threading.Thread(target=self._accept, name=self.thread_name, daemon=True).start()

    def _connect(self) -> socket.socket:
        raise NotImplementedError

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        raise NotImplementedError

    def _replies(self, upstream: socket.socket, client: socket.socket) -> None:
        raise NotImplementedError

    def cut(self) -> int:
        """Reset every open connection; returns how many there were."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                shut(sock)
        return len(pairs)

    def close(self) -> None:
        self._closed = True
        self._server.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = self._connect()
            except OSError:  # the upstream is down: the client sees its connection closed, as with no listener
                shut(client)
                continue
            with self._lock:
                self._pairs.append((client, upstream))
            threading.Thread(target=self._requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._replies, args=(upstream, client), daemon=True).start()


class DroppingProxy(TcpProxy):
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.requests: list[str] = []
        super().__init__()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def drop(self) -> int:
        """Reset every open connection; returns how many there were."""
        return self.cut()

    def _connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.upstream_port))

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        self._pipe(client, upstream, True)

    def _replies(self, upstream: socket.socket, client: socket.socket) -> None:
        self._pipe(upstream, client, False)

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
                shut(sock)


def shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
