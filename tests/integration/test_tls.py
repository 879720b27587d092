"""A ``rediss://`` Redis with a self-signed certificate, as Heroku Redis serves it: redis-py refuses it by
default, ``TASKPORT_REDIS_TLS_VERIFY=none`` accepts it, and then web and worker run a task through it.

The embedded redis-server is built without TLS, so a small TLS proxy (Python's ssl module, a
certificate made by ``openssl`` for the test) stands in front of it.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from app.core.config import Config
from app.core.connection import connect
from tests.integration.harness import Api, RedisServer, Stack


class TlsProxy:
    """TLS on 127.0.0.1:``port`` in front of a plain Redis on a unix socket; one thread per connection."""

    def __init__(self, upstream: Path, cert: Path, key: Path) -> None:
        self.upstream = upstream
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.load_cert_chain(cert, key)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopping = threading.Event()
        self.threads: list[threading.Thread] = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stopping.is_set():
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(raw,), daemon=True)
            self.threads.append(thread)
            thread.start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            tls = self.context.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError):  # e.g. a client that refuses the certificate
            raw.close()
            return
        with tls, socket.socket(socket.AF_UNIX) as up, selectors.DefaultSelector() as sel:
            up.connect(str(self.upstream))
            sel.register(tls, selectors.EVENT_READ)
            sel.register(up, selectors.EVENT_READ)
            peer = {tls: up, up: tls}
            while not self.stopping.is_set():
                ready = [tls] if tls.pending() else [key.fileobj for key, _ in sel.select(0.2)]
                for source in ready:
                    try:
                        data = source.recv(65536)  # type: ignore[union-attr]
                        if not data:
                            return
                        peer[source].sendall(data)  # type: ignore[index]
                    except (ssl.SSLError, OSError):
                        return

    def close(self) -> None:
        self.stopping.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(), which close() alone would not
        self.listener.close()
        for thread in self.threads:
            thread.join(5)


@pytest.fixture
def proxy(redis_server: RedisServer, redis_conn: redis.Redis, tmp_path: Path) -> Iterator[TlsProxy]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=redis",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60)
    tls = TlsProxy(redis_server.socket, cert, key)
    yield tls
    tls.close()


def test_a_self_signed_rediss_url_is_refused_by_default_and_accepted_when_told(proxy: TlsProxy) -> None:
    url = f"rediss://127.0.0.1:{proxy.port}/0"
    strict = connect(Config.from_env({"REDIS_URL": url}))
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        strict.ping()
    strict.close()
    relaxed = connect(Config.from_env({"REDIS_URL": url, "TASKPORT_REDIS_TLS_VERIFY": "none"}))
    with contextlib.closing(relaxed):
        assert relaxed.ping()


def test_web_and_worker_run_a_task_over_rediss(proxy: TlsProxy, tmp_path: Path) -> None:
    stack = Stack(f"rediss://127.0.0.1:{proxy.port}/0", tmp_path / "stack", redis_tls_verify="none")
    try:
        stack.start_web()
        stack.start_worker()
        with Api(stack.base_url) as api:
            task_id = api.create("demo.sleep", {"seconds": 0.1, "steps": 2})
            assert api.wait_for(task_id, "COMPLETED", timeout=20)["progress"] == 100
    finally:
        stack.teardown()
