"""A TCP proxy in front of Redis that loses replies on purpose: the command has run, its answer never arrives.

``ReplyProxy(upstream)`` listens on a free loopback port and forwards every connection to ``upstream`` (a Redis
unix socket path, or ``host:port``). Requests always go through; what comes back can be, for a while:

- **dropped** (``drop(p, seconds)``): with probability ``p`` per reply chunk, the chunk is thrown away and the
  connection is cut on both sides. Redis has executed the command (its reply exists), the client sees a
  reset: redis-py's retry then sends the command again, which is the case a write must be safe against.
- **delayed** (``delay(p, seconds, hold)``): with probability ``p`` per reply chunk, the chunk is held for
  ``hold`` s before it is forwarded (in order: the connection's later replies wait behind it). A hold longer
  than the client's socket timeout is a lost reply too; a shorter one is a slow network.

``cut()`` resets every open connection now (a network blip), ``heal()`` ends any drop or delay period. The
decisions come from ``random.Random(seed)``, so a run's choices follow its seed as far as thread timing lets
them. The core (accept, forward, ``cut()``) is tests/integration/proxy.py's ``TcpProxy``, as for the HTTP side's
proxy, which cuts connections but never reads them.
"""

from __future__ import annotations

import random
import socket
import time
from dataclasses import dataclass

from tests.integration.proxy import CHUNK, TcpProxy, shut


@dataclass
class _Period:
    probability: float = 0.0
    until: float = 0.0  # time.monotonic() when it ends
    hold: float = 0.0

    def hits(self, rng: random.Random) -> bool:
        return time.monotonic() < self.until and rng.random() < self.probability


class ReplyProxy(TcpProxy):
    thread_name = "reply-proxy"

    def __init__(self, upstream: str, seed: int = 0) -> None:
        self.upstream = upstream
        self.dropped = 0  # replies thrown away (each cut its connection)
        self.delayed = 0  # replies held
        self._rng = random.Random(seed)
        self._drop = _Period()
        self._delay = _Period()
        super().__init__()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    # -- faults ------------------------------------------------------------------------------------
    def drop(self, probability: float, seconds: float) -> None:
        """For ``seconds``, throw away each reply with ``probability`` and cut its connection."""
        with self._lock:
            self._drop = _Period(probability, time.monotonic() + seconds)

    def delay(self, probability: float, seconds: float, hold: float) -> None:
        """For ``seconds``, hold each reply with ``probability`` for ``hold`` s before forwarding it."""
        with self._lock:
            self._delay = _Period(probability, time.monotonic() + seconds, hold)

    def heal(self) -> None:
        with self._lock:
            self._drop, self._delay = _Period(), _Period()

    # -- forwarding --------------------------------------------------------------------------------
    def _connect(self) -> socket.socket:
        if self.upstream.startswith("/"):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.upstream)
            except OSError:  # Redis is down (killed or restarting): no socket left open behind
                sock.close()
                raise
            return sock
        host, port = self.upstream.rsplit(":", 1)
        return socket.create_connection((host, int(port)))

    def _requests(self, client: socket.socket, upstream: socket.socket) -> None:
        try:
            while data := client.recv(CHUNK):
                upstream.sendall(data)
        except OSError:
            pass
        finally:
            self._forget(client, upstream)

    def _replies(self, upstream: socket.socket, client: socket.socket) -> None:
        try:
            while data := upstream.recv(CHUNK):
                with self._lock:
                    drop, hold = self._drop.hits(self._rng), self._delay.hold if self._delay.hits(self._rng) else 0.0
                if drop:
                    self.dropped += 1
                    break  # the command ran; its reply goes nowhere and the connection is cut
                if hold:
                    self.delayed += 1
                    time.sleep(hold)  # the fault itself: this connection's replies arrive late
                client.sendall(data)
        except OSError:
            pass
        finally:
            self._forget(client, upstream)

    def _forget(self, client: socket.socket, upstream: socket.socket) -> None:
        with self._lock:
            if (client, upstream) in self._pairs:
                self._pairs.remove((client, upstream))
        shut(client)
        shut(upstream)
