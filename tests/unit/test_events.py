"""GET /api/v1/tasks/{id}/events (SSE) on the test client with fakeredis pub/sub.

Each test drives a stream by hand: it reads one chunk (one event or comment) from the unbuffered
response, writes to the store in between, and reads on. Heartbeat and poll intervals are long unless
a test is about them, so every event comes from a pub/sub message and nothing depends on timing.
"""

from __future__ import annotations

import dataclasses
import resource
import threading
import time
import uuid
from collections.abc import Iterator

import orjson
import pytest

from app.core import keys
from app.core.clock import now_ms
from app.core.config import Config
from app.core.store import TaskStore
from app.web import create_app, streams, webworker
from app.web.api.events import TaskStream, format_event
from app.web.runtime import EXTENSION
from app.web.streams import EventHub, Reading, StreamSlots
from app.web.webworker import allow_open_files, direct_socket

LONG = 30.0
KEEP_ALIVE = b": keep-alive\n\n"


def make_app(config, conn, heartbeat=LONG, poll=LONG, **settings):
    return create_app(dataclasses.replace(config, sse_heartbeat=heartbeat, sse_poll=poll, **settings), conn=conn)


@pytest.fixture
def app(config, conn):
    return make_app(config, conn)


@pytest.fixture
def store(app) -> TaskStore:
    return app.extensions[EXTENSION].service.store


@pytest.fixture
def task_id(client) -> str:
    return client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]


class Stream:
    """An open event stream: ``next()`` is the next chunk; always closed by the fixture's ``with``."""

    def __init__(self, client, task_id: str, **headers: str) -> None:
        self.response = client.get(f"/api/v1/tasks/{task_id}/events", headers=headers, buffered=False)
        self.chunks: Iterator[bytes] = iter(self.response.response)

    def next(self) -> bytes:
        return next(self.chunks)

    def event(self) -> tuple[str, int, dict]:
        return parse(self.next())

    def rest(self) -> list[bytes]:
        return list(self.chunks)

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.response.close()


def parse(chunk: bytes) -> tuple[str, int, dict]:
    """(event name, id, data) of one event chunk."""
    assert chunk.endswith(b"\n\n")
    lines = dict(line.split(": ", 1) for line in chunk.decode().strip().split("\n"))
    return lines["event"], int(lines["id"]), orjson.loads(lines["data"])


def test_first_event_is_the_current_status_document(client, task_id):
    with Stream(client, task_id) as stream:
        assert stream.response.status_code == 200
        assert stream.response.headers["Content-Type"] == "text/event-stream"
        assert stream.response.headers["Cache-Control"] == "no-cache"
        assert stream.response.headers["X-Accel-Buffering"] == "no"
        name, seq, doc = stream.event()
    assert (name, seq) == ("status", 0)
    assert doc == client.get(f"/api/v1/tasks/{task_id}").get_json()


def test_each_change_is_an_event_and_the_stream_ends_after_the_terminal_one(client, store, task_id):
    with Stream(client, task_id) as stream:
        stream.event()
        store.start(task_id, "run-1")
        assert stream.event()[1:] == (1, stream_doc(client, task_id))
        store.report(task_id, "run-1", 40, "item 4 of 10", {"total": 10, "succeeded": 3, "failed": 1})
        _, seq, doc = stream.event()
        assert seq == 2 and doc["progress"] == 40 and doc["message"] == "item 4 of 10"
        assert doc["items"] == {"total": 10, "succeeded": 3, "failed": 1}
        store.complete(task_id, "run-1", {"ok": True}, items=None, failures=[], error_code=None)
        _, seq, doc = stream.event()
        assert seq == 3 and doc["status"] == "COMPLETED" and doc["progress"] == 100
        assert stream.rest() == []


def stream_doc(client, task_id: str) -> dict:
    return client.get(f"/api/v1/tasks/{task_id}").get_json()


def test_a_cancel_is_the_terminal_event(client, task_id):
    with Stream(client, task_id) as stream:
        stream.event()
        assert client.delete(f"/api/v1/tasks/{task_id}").status_code == 204
        assert stream.event()[2]["status"] == "CANCELLED"
        assert stream.rest() == []


def test_failed_is_terminal_with_its_error(client, store, task_id):
    with Stream(client, task_id) as stream:
        stream.event()
        store.start(task_id, "run-1")
        stream.event()
        store.fail(task_id, "run-1", 10001, "bill unpaid")
        _, _, doc = stream.event()
        assert doc["status"] == "FAILED" and doc["error"] == {"code": 10001, "message": "bill unpaid"}
        assert stream.rest() == []


def test_an_idle_stream_sends_keep_alive_comments(config, conn):
    client = make_app(config, conn, heartbeat=0.02).test_client()
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]
    with Stream(client, task_id) as stream:
        stream.event()
        assert stream.next() == KEEP_ALIVE
        assert stream.next() == KEEP_ALIVE


def test_a_lost_message_is_caught_up_by_the_poll(config, conn):
    app = make_app(config, conn, poll=0.02)
    client = app.test_client()
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]
    with Stream(client, task_id) as stream:
        stream.event()
        conn.hset(keys.task(task_id), mapping={"progress": 7, "seq": 5})  # a write whose PUBLISH got lost
        _, seq, doc = stream.event()
    assert seq == 5 and doc["progress"] == 7


def test_expiry_passing_mid_stream_ends_it_as_expired(config, conn):
    client = make_app(config, conn, poll=0.02).test_client()
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]
    with Stream(client, task_id) as stream:
        stream.event()
        conn.hset(keys.task(task_id), "expires_at", 1)  # due, housekeeping not run yet
        _, seq, doc = stream.event()
        assert seq == 0 and doc["status"] == "EXPIRED" and doc["error"]["code"] == -4
        assert stream.rest() == []


def advance(store: TaskStore, task_id: str) -> None:
    """Two changes: PROCESSING (seq 1), then progress 50 (seq 2)."""
    store.start(task_id, "run-1")
    store.report(task_id, "run-1", 50, "half way")


def test_reconnect_behind_gets_the_current_document_then_continues(client, store, task_id):
    advance(store, task_id)
    with Stream(client, task_id, **{"Last-Event-ID": "1"}) as stream:
        _, seq, doc = stream.event()
        assert seq == 2 and doc["progress"] == 50
        store.complete(task_id, "run-1", None, items=None, failures=[], error_code=None)
        assert stream.event()[1] == 3
        assert stream.rest() == []


def test_reconnect_up_to_date_gets_no_snapshot_only_later_changes(client, store, task_id):
    advance(store, task_id)
    with Stream(client, task_id, **{"Last-Event-ID": "2"}) as stream:
        assert stream.next() == KEEP_ALIVE  # opens the stream without repeating event 2
        store.report(task_id, "run-1", 60, "more")
        _, seq, doc = stream.event()
        assert seq == 3 and doc["progress"] == 60


def test_reconnect_after_the_terminal_event_ends_without_events(client, task_id):
    client.delete(f"/api/v1/tasks/{task_id}")
    seq = stream_doc_seq(client, task_id)
    with Stream(client, task_id, **{"Last-Event-ID": str(seq)}) as stream:
        assert stream.response.status_code == 200
        assert [c for c in stream.rest() if not c.startswith(b":")] == []


def stream_doc_seq(client, task_id: str) -> int:
    with Stream(client, task_id) as stream:
        return stream.event()[1]


def test_a_last_event_id_this_task_never_had_gets_the_snapshot(client, task_id):
    with Stream(client, task_id, **{"Last-Event-ID": "999"}) as stream:
        assert stream.event()[1] == 0


@pytest.mark.parametrize("last_id", ["not-a-number", "-1", "1.5", "\u00b2", "\u0661", "9" * 5000, str(2**63),
                                     str(10**18)])  # 19 digits: past the document's pattern
def test_a_last_event_id_that_is_no_event_id_is_422_naming_the_header(client, conn, task_id, last_id):
    r = client.get(f"/api/v1/tasks/{task_id}/events", headers={"Last-Event-ID": last_id})
    assert r.status_code == 422
    assert r.headers["Content-Type"] == "application/problem+json"
    assert list(r.get_json()["errors"]) == ["Last-Event-ID"]
    assert open_slots(conn) == 0


def test_the_largest_event_id_is_accepted(client, task_id):
    with Stream(client, task_id, **{"Last-Event-ID": "9" * 18}) as stream:  # the document's pattern: 18 digits
        assert stream.event()[1] == 0


@pytest.mark.parametrize("task_id", [str(uuid.uuid4()), "not-a-uuid"])
def test_unknown_task_is_404_problem_before_streaming(client, task_id):
    r = client.get(f"/api/v1/tasks/{task_id}/events")
    assert r.status_code == 404
    assert r.headers["Content-Type"] == "application/problem+json"
    assert r.get_json()["detail"] == "task not found or expired"


def test_expired_task_is_410_with_its_status_document_like_status(client, conn, task_id):
    conn.hset(keys.task(task_id), "expires_at", 1)
    r = client.get(f"/api/v1/tasks/{task_id}/events")
    status = client.get(f"/api/v1/tasks/{task_id}")
    assert r.status_code == status.status_code == 410
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.get_json() == status.get_json() and r.get_json()["status"] == "EXPIRED"
    assert open_slots(conn) == 0


def test_someone_elses_task_is_404_and_no_key_is_401(config, conn):
    client = make_app(config, conn, api_keys="ka:alice,kb:bob").test_client()
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}},
                          headers={"Authorization": "Bearer ka"}).get_json()["task_id"]
    assert client.get(f"/api/v1/tasks/{task_id}/events", headers={"Authorization": "Bearer kb"}).status_code == 404
    assert client.get(f"/api/v1/tasks/{task_id}/events").status_code == 401
    with Stream(client, task_id, Authorization="Bearer ka") as stream:
        assert stream.event()[2]["task_id"] == task_id


def open_slots(conn, member: str = "public") -> int:
    return conn.zcard(keys.streams(member))


def hub(app) -> EventHub:
    return app.extensions[EXTENSION].streams.hub


def test_the_watch_and_slot_are_released_when_the_client_goes_away(app, client, conn, task_id):
    stream = Stream(client, task_id)
    stream.event()
    assert (hub(app).watching, open_slots(conn)) == (1, 1)
    stream.response.close()
    assert (hub(app).watching, open_slots(conn)) == (0, 0)


def test_the_watch_and_slot_are_released_when_closed_before_the_first_chunk(app, client, conn, task_id):
    response = client.get(f"/api/v1/tasks/{task_id}/events", buffered=False)
    assert (hub(app).watching, open_slots(conn)) == (1, 1)
    response.close()
    assert (hub(app).watching, open_slots(conn)) == (0, 0)


def test_the_watch_and_slot_are_released_when_the_stream_ends(app, client, conn, task_id):
    with Stream(client, task_id) as stream:
        stream.event()
        client.delete(f"/api/v1/tasks/{task_id}")
        stream.rest()
        assert (hub(app).watching, open_slots(conn)) == (0, 0)


# -- the per-member cap, the stream lifetime, the shared hub -------------------------------------------


def test_a_member_over_the_stream_cap_gets_429_problem_with_retry_after(config, conn):
    app = make_app(config, conn, api_keys="ka:alice,kb:bob", max_streams_per_member=2)
    client = app.test_client()
    alice, bob = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}, headers=alice).get_json()[
        "task_id"]
    bobs = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}, headers=bob).get_json()["task_id"]
    with Stream(client, task_id, **alice) as first, Stream(client, task_id, **alice):
        r = client.get(f"/api/v1/tasks/{task_id}/events", headers=alice)
        assert r.status_code == 429
        assert r.headers["Content-Type"] == "application/problem+json"
        assert int(r.headers["Retry-After"]) > 0
        assert "2 open event streams" in r.get_json()["detail"]
        assert open_slots(conn, "alice") == 2
        with Stream(client, bobs, **bob) as other:  # another member's count is its own
            assert other.event()[0] == "status"
        first.response.close()
        with Stream(client, task_id, **alice) as again:  # a closed stream gives its slot back
            assert again.event()[0] == "status"


def test_a_slot_whose_lease_ran_out_no_longer_counts(config, conn, task_id):
    client = make_app(config, conn, max_streams_per_member=1).test_client()
    conn.zadd(keys.streams("public"), {"4242:of-a-killed-process": 1})  # lease ran out long ago
    with Stream(client, task_id) as stream:
        assert stream.event()[0] == "status"
        assert conn.zscore(keys.streams("public"), "4242:of-a-killed-process") is None


def test_open_slots_have_their_lease_renewed(conn):
    slots = StreamSlots(conn, cap=5)
    slot = slots.acquire("public")
    conn.zadd(keys.streams("public"), {slot: 1})  # as if the lease were about to run out
    slots.renew()
    assert conn.zscore(keys.streams("public"), slot) > now_ms()
    slots.release(slot)
    slots.renew()  # a released slot is never revived
    assert conn.zscore(keys.streams("public"), slot) is None


def test_a_stream_ends_at_its_lifetime_and_resumes_with_last_event_id(config, conn):
    client = make_app(config, conn, sse_max_minutes=0.1 / 60).test_client()  # 0.1 s
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]
    with Stream(client, task_id) as stream:
        _, seq, _ = stream.event()
        assert stream.rest() == [b": reconnect\n\n"]  # ended by the server, the task still PENDING
    with Stream(client, task_id, **{"Last-Event-ID": str(seq)}) as resumed:
        assert resumed.next() == KEEP_ALIVE  # nothing missed, nothing repeated


def test_many_streams_share_one_hub_and_every_one_gets_each_change(app, client, store, conn, task_id):
    other = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"seconds": 1}}).get_json()["task_id"]
    watchers = [Stream(client, t) for t in [task_id] * 3 + [other] * 2]
    try:
        for w in watchers:
            w.event()
        assert hub(app).watching == 5
        store.start(task_id, "run-1")
        store.start(other, "run-2")
        assert [w.event()[1] for w in watchers] == [1] * 5
    finally:
        for w in watchers:
            w.response.close()
    assert hub(app).watching == 0


def test_an_open_stream_outlives_a_redis_outage_and_resumes(config, conn):
    server = conn.connection_pool.connection_kwargs["server"]
    app = make_app(config, conn, heartbeat=0.05, poll=0.05)
    client = app.test_client()
    store = app.extensions[EXTENSION].service.store
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]
    with Stream(client, task_id) as stream:
        stream.event()
        server.connected = False
        assert stream.next() == KEEP_ALIVE  # Redis away: the stream stays open
        assert stream.next() == KEEP_ALIVE
        server.connected = True
        store.start(task_id, "run-1")
        chunk = stream.next()
        while chunk == KEEP_ALIVE:
            chunk = stream.next()
        assert parse(chunk)[1] == 1


def test_the_default_cap_lets_one_member_hold_the_benchmarks_1000_streams():
    assert Config.from_env({}).max_streams_per_member >= 1000


def test_the_gevent_worker_raises_the_open_file_limit_towards_its_connections():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        allow_open_files(1024)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(1024, hard)
        allow_open_files(300)  # never lowered
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == min(1024, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


class ScriptedPubSub:
    """Hands out the given messages one per ``get_message`` call (then None), recording each call's timeout."""

    def __init__(self, *task_ids: str) -> None:
        self.messages = [{"type": "pmessage", "channel": keys.events(t).encode()} for t in task_ids]
        self.timeouts: list[float] = []

    def get_message(self, ignore_subscribe_messages: bool, timeout: float) -> dict | None:
        self.timeouts.append(timeout)
        return self.messages.pop(0) if self.messages else None


def test_the_hub_keeps_collecting_announcements_for_its_coalescing_window(app, conn):
    rt = app.extensions[EXTENSION]
    hub = EventHub(rt.redis, rt.service.store, rt.streams.slots, poll=LONG, coalesce=0.25)
    pubsub = ScriptedPubSub("a", "b", "a")
    assert hub._drain(pubsub, timeout=LONG) == {"a", "b"}
    first, *then = pubsub.timeouts
    assert first == LONG
    # after the first announcement it waits for more (up to the window), not only for what is queued already
    assert len(then) == 3 and 0 < then[0] <= 0.25 and all(0 <= t <= then[0] for t in then)


def test_without_a_coalescing_window_the_hub_takes_only_what_is_queued(app, conn):
    rt = app.extensions[EXTENSION]
    hub = EventHub(rt.redis, rt.service.store, rt.streams.slots, poll=LONG, coalesce=0.0)
    pubsub = ScriptedPubSub("a", "b")
    assert hub._drain(pubsub, timeout=LONG) == {"a", "b"}
    assert pubsub.timeouts == [LONG, 0.0, 0.0]


# -- the hub writes plain changes straight to a waiting stream's socket (gevent worker) ----------------


class RecordingSocket:
    """Stands in for the client's gevent socket: ``send`` takes at most ``room`` bytes, never waits."""

    def __init__(self, room: int = 1 << 20) -> None:
        self.room = room
        self.sent = bytearray()
        self.timeouts: list[float] = []

    def send(self, data: bytes, flags: int, timeout: float) -> int:
        self.timeouts.append(timeout)
        if not self.room:
            raise BlockingIOError
        taken = data[:self.room]
        self.room -= len(taken)
        self.sent += taken
        return len(taken)

    def sendall(self, data: bytes) -> None:
        self.sent += data


def chunk_of(event: bytes) -> bytes:
    """An event as gunicorn frames one write of a chunked response."""
    return b"%X\r\n%s\r\n" % (len(event), event)


def open_task_stream(app, conn, task_id: str, sock: RecordingSocket) -> tuple[TaskStream, Iterator[bytes]]:
    found = app.extensions[EXTENSION].streams
    slot = found.slots.acquire("public")
    stream = TaskStream(found.hub, found.slots, task_id, slot, heartbeat=LONG, lifetime=LONG * 60)
    stream.sock = sock
    return stream, stream.run(app.extensions[EXTENSION].service.store.get(task_id), None)


def next_in_thread(chunks: Iterator[bytes]) -> tuple[threading.Thread, list[bytes]]:
    got: list[bytes] = []
    thread = threading.Thread(target=lambda: got.append(next(chunks, b"")), daemon=True)  # b"": it ended
    thread.start()
    return thread, got


def end(stream: TaskStream, thread: threading.Thread) -> None:
    """Hang the stream up and wait for its reader thread to finish, then release it."""
    stream.hang_up()
    thread.join(5)
    assert not thread.is_alive()
    stream.close()


def until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


def test_the_hub_writes_a_change_to_a_waiting_stream_as_one_chunk_without_waking_it(app, conn, store, task_id):
    sock = RecordingSocket()
    stream, chunks = open_task_stream(app, conn, task_id, sock)
    assert parse(next(chunks))[1] == 0  # the snapshot goes through the response, as always
    thread, got = next_in_thread(chunks)
    try:
        until(lambda: stream.watch is not None and stream.watch.push is not None)  # parked: pushes allowed
        store.start(task_id, "run-1")
        until(lambda: bool(sock.sent))
        name, seq, doc = parse(bytes(sock.sent).split(b"\r\n", 1)[1][:-2])
        assert bytes(sock.sent) == chunk_of(format_event(seq, doc))
        assert (name, seq, doc["status"]) == ("status", 1, "PROCESSING") and sock.timeouts == [0.0]
        assert thread.is_alive() and got == []  # the stream's own loop never woke
        store.complete(task_id, "run-1", {"ok": True}, items=None, failures=[], error_code=None)
        thread.join(5)  # a final state is the stream's to send (and then it ends)
        assert parse(got[0])[1:] == (2, stream_doc(app.test_client(), task_id))
        assert list(chunks) == [] and bytes(sock.sent) == chunk_of(format_event(seq, doc))
    finally:
        end(stream, thread)


def test_a_push_the_socket_cannot_take_whole_is_finished_by_the_stream(app, conn, store, task_id):
    sock = RecordingSocket(room=10)
    stream, chunks = open_task_stream(app, conn, task_id, sock)
    next(chunks)
    thread, got = next_in_thread(chunks)
    try:
        until(lambda: stream.watch is not None and stream.watch.push is not None)
        store.start(task_id, "run-1")
        until(lambda: stream.unsent == b"" and len(sock.sent) > 10)  # the stream woke and wrote the rest
        assert parse(bytes(sock.sent).split(b"\r\n", 1)[1][:-2])[1] == 1
        first = bytes(sock.sent)
        store.report(task_id, "run-1", 50, "half")  # the socket takes nothing now: the stream writes it all
        until(lambda: len(sock.sent) > len(first) and stream.unsent == b"")
        second = bytes(sock.sent[len(first):])
        assert sock.timeouts == [0.0, 0.0]
        _, seq, doc = parse(second.split(b"\r\n", 1)[1][:-2])
        assert second == chunk_of(format_event(seq, doc)) and (seq, doc["progress"]) == (2, 50)
        assert thread.is_alive() and got == []  # all of it written from the stream's wait, nothing yielded
    finally:
        end(stream, thread)


def test_push_refuses_what_is_not_a_plain_newer_change(app, conn, store, task_id):
    sock = RecordingSocket()
    stream, chunks = open_task_stream(app, conn, task_id, sock)
    next(chunks)
    thread, _ = next_in_thread(chunks)
    try:
        until(lambda: stream.watch is not None and stream.watch.push is not None)  # parked, as when the hub pushes
        snapshot = store.get(task_id)
        assert not stream.push(Reading(snapshot))  # not newer than what the client has
        store.cancel(task_id)
        assert not stream.push(Reading(store.get(task_id)))  # final: the stream sends it and ends
        assert sock.sent == b""
    finally:
        end(stream, thread)


def test_a_refused_push_leaves_every_later_read_to_the_woken_stream(store, task_id):
    task = store.get(task_id)
    w = streams.Watch(task_id)
    offered: list[int] = []

    def refuse(reading):
        offered.append(reading.task.seq)
        return False

    w.push = refuse
    first, second = (Reading(dataclasses.replace(task, seq=n)) for n in (1, 2))
    w.deliver(first)
    w.deliver(second)  # not offered: the stream is awake and would otherwise see them out of order
    assert offered == [1] and w.wait(0) == (True, second)


def test_an_accepted_push_does_not_wake_the_stream(store, task_id):
    w = streams.Watch(task_id)
    w.push = lambda reading: True
    w.deliver(Reading(dataclasses.replace(store.get(task_id), seq=1)))
    assert w.wait(0) == (False, None)


def test_only_a_get_over_http_1_1_under_the_gevent_worker_may_be_written_to_directly(monkeypatch):
    sock = object()
    environ = {"gunicorn.socket": sock, "REQUEST_METHOD": "GET", "SERVER_PROTOCOL": "HTTP/1.1"}
    assert direct_socket(environ) is None  # the test process is not monkey-patched (a thread per request)
    monkeypatch.setattr(webworker.monkey, "is_module_patched", lambda name: name == "socket")
    assert direct_socket(environ) is sock
    # responses gunicorn does not frame as chunks
    assert direct_socket({**environ, "SERVER_PROTOCOL": "HTTP/1.0"}) is None
    assert direct_socket({**environ, "REQUEST_METHOD": "HEAD"}) is None
    assert direct_socket({"REQUEST_METHOD": "GET", "SERVER_PROTOCOL": "HTTP/1.1"}) is None
