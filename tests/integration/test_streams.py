"""Live watchers against the real web process (gunicorn, gevent worker) and a real redis-server.

The 1,000-watcher figures are in the bench (``make bench``, "watchers" rows); here: 200 open streams
while polls still answer and every stream gets a change, the per-member cap counted across two web
processes, the stream lifetime, a Redis restart under open streams, and 50 slow-header plus 50
slow-read clients while polls answer in under 1 s.

Streams are read over raw sockets (:class:`SseClient`): a few hundred of them in one test process
cost nothing, and the chunked framing and timing are the server's own, unbuffered.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import requests

from app.core import keys
from app.core.store import TaskStore
from tests.integration.harness import TASKS, Api, RedisServer, Stack, wait_until

POLL_DEADLINE = 1.0  # seconds: the bound for a poll while slow clients hang on


class SseClient:
    """One event stream over a raw socket: the response head, then events decoded from chunked framing."""

    def __init__(self, port: int, task_id: str, headers: dict[str, str] | None = None, timeout: float = 30.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.sock.sendall(f"GET {TASKS}/{task_id}/events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}\r\n".encode())
        self.raw = bytearray()
        self.body = bytearray()
        self.ended = False
        head = self._until(b"\r\n\r\n")
        self.status = int(head[9:12])
        self.head = head.decode("latin-1").lower()

    def _recv(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise EOFError("the server closed the connection")
        self.raw += data

    def _until(self, marker: bytes) -> bytes:
        while (at := self.raw.find(marker)) < 0:
            self._recv()
        out = bytes(self.raw[:at])
        del self.raw[:at + len(marker)]
        return out

    def _decode_chunk(self) -> None:
        size = int(self._until(b"\r\n").split(b";")[0], 16)
        while len(self.raw) < size + 2:
            self._recv()
        if size == 0:
            self.ended = True
        self.body += self.raw[:size]
        del self.raw[:size + 2]

    def next(self) -> bytes:
        """The next event or comment (``b""`` once the server ended the stream)."""
        while (at := self.body.find(b"\n\n")) < 0:
            if self.ended:
                return b""
            self._decode_chunk()
        out = bytes(self.body[:at + 2])
        del self.body[:at + 2]
        return out

    def event(self) -> dict[str, Any]:
        """The next ``status`` event (comments skipped) as {"id", "data"}."""
        while True:
            chunk = self.next()
            if not chunk:
                raise EOFError("the stream ended")
            if not chunk.startswith(b":"):
                fields = dict(line.split(": ", 1) for line in chunk.decode().strip().split("\n"))
                return {"id": int(fields["id"]), "data": orjson.loads(fields["data"])}

    def body_json(self) -> dict[str, Any]:
        """The body of a non-streaming answer (Content-Length framed)."""
        length = int(self.head.split("content-length:")[1].split("\r\n")[0])
        while len(self.raw) < length:
            self._recv()
        return orjson.loads(bytes(self.raw[:length]))  # type: ignore[no-any-return]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def api(stack: Stack) -> Iterator[Api]:
    with Api(stack.base_url, timeout=5) as client:
        yield client


def store_of(stack: Stack) -> TaskStore:
    return TaskStore(stack.redis(), stack.config)


def timed_poll(api: Api, task_id: str) -> float:
    started = time.monotonic()
    r = api.get(f"{TASKS}/{task_id}", timeout=POLL_DEADLINE)
    assert r.status_code == 200, r.text
    return time.monotonic() - started


def pubsub_connections(conn: redis.Redis) -> int:
    return sum(1 for c in conn.client_list() if c.get("psub") not in (None, "0") or c.get("sub") not in (None, "0"))


def test_200_streams_share_one_pubsub_connection_each_gets_every_change_and_polls_answer(
        stack: Stack, api: Api, redis_conn: redis.Redis) -> None:
    stack.configure(web_concurrency=2)
    stack.start_web()
    task_ids = [api.create("demo.sleep", {"seconds": 60 + n}) for n in range(4)]
    clients = [SseClient(stack.config.port, task_ids[i % 4]) for i in range(200)]
    try:
        assert all(c.status == 200 and c.event()["id"] == 0 for c in clients)
        assert pubsub_connections(redis_conn) <= 2  # one per web process, not one per stream
        assert max(timed_poll(api, t) for t in task_ids * 10) < POLL_DEADLINE
        store = store_of(stack)
        for n, task_id in enumerate(task_ids):
            store.start(task_id, f"run-{n}")
        started = time.monotonic()
        got = [c.event() for c in clients]
        assert time.monotonic() - started < 5.0
        assert all(e["id"] == 1 and e["data"]["status"] == "PROCESSING" for e in got)
        assert api.get("/healthz").status_code == 200
    finally:
        for c in clients:
            c.close()
    wait_until(lambda: redis_conn.zcard(keys.streams("public")) == 0, timeout=10, message="slots released")


def test_changes_written_by_the_hub_arrive_in_order_and_the_stream_still_ends_cleanly(
        stack: Stack, api: Api) -> None:
    """Under the gevent worker plain changes go straight from the hub to the socket as chunks, the final
    one through the response: the client sees each change in order, then the chunked body's proper end."""
    stack.start_web()
    task_id = api.create("demo.sleep", {"seconds": 60})
    clients = [SseClient(stack.config.port, task_id) for _ in range(3)]
    try:
        assert [c.event()["id"] for c in clients] == [0, 0, 0]
        store = store_of(stack)
        store.start(task_id, "run-1")
        assert [c.event()["id"] for c in clients] == [1, 1, 1]
        for seq, percent in ((2, 20), (3, 40)):  # each read before the next write: nothing coalesced
            store.report(task_id, "run-1", percent, f"at {percent}")
            got = [c.event() for c in clients]
            assert all((e["id"], e["data"]["progress"], e["data"]["status"]) == (seq, percent, "PROCESSING")
                       for e in got)
        store.complete(task_id, "run-1", {"ok": True}, items=None, failures=[], error_code=None)
        final = [c.event() for c in clients]
        assert all((e["id"], e["data"]["status"]) == (4, "COMPLETED") for e in final)
        assert [c.next() for c in clients] == [b"", b"", b""]
        assert all(c.ended for c in clients)  # the zero-length chunk: the framing held through the hub's writes
    finally:
        for c in clients:
            c.close()


def test_the_stream_cap_is_counted_across_web_processes(
        redis_server: RedisServer, redis_conn: redis.Redis, tmp_path: Path) -> None:
    first = Stack(redis_server.url, tmp_path / "a", max_streams_per_member=3)
    second = Stack(redis_server.url, tmp_path / "b", max_streams_per_member=3)
    clients: list[SseClient] = []
    try:
        first.start_web()
        second.start_web()
        with Api(first.base_url) as api:
            task_id = api.create("demo.sleep", {"seconds": 60})
        clients += [SseClient(first.config.port, task_id) for _ in range(2)]
        clients.append(SseClient(second.config.port, task_id))
        assert [c.status for c in clients] == [200, 200, 200]
        refused = SseClient(second.config.port, task_id)
        clients.append(refused)
        assert refused.status == 429
        assert "application/problem+json" in refused.head and "retry-after:" in refused.head
        assert refused.body_json()["status"] == 429
        clients[0].close()  # the server notices the hang-up at once and frees the slot
        wait_until(lambda: redis_conn.zcard(keys.streams("public")) == 2, timeout=10, message="a slot freed")
        again = SseClient(second.config.port, task_id)
        clients.append(again)
        assert again.status == 200
    finally:
        for c in clients:
            c.close()
        first.teardown()
        second.teardown()


def test_a_stream_ends_at_its_lifetime_and_resumes_with_last_event_id(stack: Stack, api: Api) -> None:
    lifetime = 2.0
    stack.configure(sse_max_minutes=lifetime / 60)
    stack.start_web()
    task_id = api.create("demo.sleep", {"seconds": 60})
    started = time.monotonic()
    client = SseClient(stack.config.port, task_id)
    try:
        last = client.event()["id"]
        while chunk := client.next():
            assert chunk.startswith(b":"), chunk  # nothing but comments until the end
        took = time.monotonic() - started
    finally:
        client.close()
    assert lifetime * 0.85 <= took < lifetime + 3.0
    resumed = SseClient(stack.config.port, task_id, {"Last-Event-ID": str(last)})
    try:
        assert resumed.next() == b": keep-alive\n\n"  # up to date: nothing repeated
        store_of(stack).start(task_id, "run-1")
        assert resumed.event()["id"] == last + 1
    finally:
        resumed.close()


@pytest.mark.parametrize("last_id", ["\u00b2", "9" * 5000])
def test_a_last_event_id_that_is_no_event_id_is_422_from_the_real_server(stack: Stack, api: Api, last_id: str) -> None:
    stack.start_web()
    task_id = api.create("demo.sleep", {"seconds": 60})
    client = SseClient(stack.config.port, task_id, {"Last-Event-ID": last_id})  # sent as UTF-8 bytes
    try:
        assert client.status == 422
        assert "application/problem+json" in client.head
        assert client.body_json()["errors"].keys() == {"Last-Event-ID"}
    finally:
        client.close()


def test_open_streams_carry_on_after_a_redis_crash_and_restart(redis_factory: Any, tmp_path: Path) -> None:
    server = redis_factory(fsync="always")  # every acknowledged write survives the kill
    stack = Stack(server.url, tmp_path / "stack", sse_heartbeat=0.5)
    try:
        stack.start_web()
        with Api(stack.base_url) as api:
            task_id = api.create("demo.sleep", {"seconds": 60})
            client = SseClient(stack.config.port, task_id)
            try:
                assert client.event()["id"] == 0
                server.kill9()
                assert client.next() == b": keep-alive\n\n"  # Redis away: the stream stays open
                assert api.get(f"{TASKS}/{task_id}").status_code == 503
                server.start()
                wait_until(lambda: api.get(f"{TASKS}/{task_id}").status_code == 200, timeout=10,
                           ignore=(requests.RequestException,), message="reads to work again")
                wait_until(lambda: pubsub_connections(server.client()) >= 1, timeout=15,
                           message="the hub to re-subscribe")
                store_of(stack).start(task_id, "run-1")
                assert client.event()["id"] == 1  # the same stream, no reconnect by the client
            finally:
                client.close()
        web = stack.procs[0]
        assert web.alive
        assert "Traceback" not in web.log(), web.tail()
    finally:
        stack.teardown()


def test_the_gevent_web_serves_metrics_and_the_dashboard(stack: Stack) -> None:
    """gunicorn's gevent worker monkey-patches before the app loads: prometheus_client, rq-dashboard and
    redis-py (hiredis) run under it unchanged, as every other integration test shows for the API."""
    stack.configure(dashboard_password="s3cret")
    proc = stack.start_web()
    stack.start_worker()
    assert "Using worker: app.web.webworker.GeventWorker" in proc.log()
    with Api(stack.base_url) as api:
        metrics = api.get("/metrics", auth=("admin", "s3cret"))
        assert metrics.status_code == 200 and "taskport_redis_up 1.0" in metrics.text
        assert "taskport_rq_workers 1.0" in metrics.text
        page = api.get("/rq/", auth=("admin", "s3cret"))
        assert page.status_code == 200 and "RQ" in page.text
        queues = api.get("/rq/0/data/queues.json", auth=("admin", "s3cret"))
        assert queues.status_code == 200
        assert isinstance(queues.json()["queues"], list)
        workers = api.get("/rq/0/data/workers.json", auth=("admin", "s3cret"))
        assert workers.status_code == 200 and len(workers.json()["workers"]) == 1
    assert "Traceback" not in proc.log(), proc.tail()


def slow_header_client(port: int) -> socket.socket:
    """A client that sends a request line and then trickles its headers (never finishing them)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(f"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n".encode())
    return s


def slow_read_client(port: int, path: str) -> socket.socket:
    """A client that asks for a large response and does not read it (a tiny receive window)."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return s


def closed_by_server(s: socket.socket) -> bool:
    """True once the server has closed the connection (EOF or reset); False while it is merely silent."""
    s.settimeout(0.2)
    try:
        return s.recv(1 << 16) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def bytes_until_closed(s: socket.socket, timeout: float) -> int:
    """Read everything the server sends until it closes; TimeoutError if it goes quiet but keeps it open."""
    s.settimeout(timeout)
    total = 0
    try:
        while chunk := s.recv(1 << 20):
            total += len(chunk)
    except ConnectionResetError:
        pass
    return total


@pytest.mark.serial  # a duration under CPU contention: run alone (tests/README.md, "Speed")
def test_slow_header_and_slow_read_clients_leave_polls_answering(stack: Stack, api: Api) -> None:
    io_timeout = 2.0
    stack.configure(web_io_timeout=io_timeout)
    stack.start_web()
    stack.start_worker()
    export = api.create("orders.export", {"rows": 200_000})
    api.wait_for(export, "COMPLETED", timeout=60)
    file = api.get(f"{TASKS}/{export}/result").json()["result"]["file"]
    task_id = export  # the task the polls read
    slow_headers = [slow_header_client(stack.config.port) for _ in range(50)]
    slow_readers = [slow_read_client(stack.config.port, file["url"]) for _ in range(50)]
    try:
        started, n = time.monotonic(), 0
        while time.monotonic() - started < io_timeout + 1.5:  # the stalled transfers' whole allowance
            for s in slow_headers:
                s.sendall(f"X-Slow-{n}: 1\r\n".encode())  # one more header line each round
            assert max(timed_poll(api, task_id) for _ in range(10)) < POLL_DEADLINE
            n += 1
        # the io timeout has passed: the server dropped every stalled download before sending it whole
        received = [bytes_until_closed(s, timeout=5.0) for s in slow_readers]
        assert max(received) < file["size"], (received, file["size"])
        # gunicorn (gevent) bounds a whole request head by --keep-alive (5 s)
        wait_until(lambda: all(closed_by_server(s) for s in slow_headers), timeout=15, interval=0.2,
                   message="the slow-header connections to be closed by the server")
        assert timed_poll(api, task_id) < POLL_DEADLINE
        web = stack.procs[0]
        assert "no byte moved" in web.log() and "Traceback" not in web.log(), web.tail()
    finally:
        for s in slow_headers + slow_readers:
            s.close()
