"""Bounded answers to unbounded input, on the Flask test client with fakeredis: Redis saying "not now"
is a 503 (never a 500 with a traceback), garbage cursors and oversize chunked bodies are 4xx, made-up
HTTP methods share one metrics series, and a history page reads O(limit) entries however little its
filter matches. tests/integration/test_bounds.py checks the same against real servers.
"""

from __future__ import annotations

import base64
import io
import logging
import uuid

import orjson
import pytest
import redis
from werkzeug.test import EnvironBuilder, run_wsgi_app

from app.core.answers import NewTask
from app.core.clock import now_ms
from app.core.history import HISTORY_SCAN, Histories
from app.core.lines import Places
from app.core.store import TaskStore

PROBLEM = "application/problem+json"


@pytest.mark.parametrize("error", [
    redis.exceptions.ConnectionError("Connection refused"),
    redis.exceptions.TimeoutError("Timeout reading from socket"),
    redis.exceptions.OutOfMemoryError("command not allowed when used memory > 'maxmemory'."),
    redis.exceptions.ReadOnlyError("You can't write against a read only replica."),
    redis.exceptions.BusyLoadingError("Redis is loading the dataset in memory"),
    redis.exceptions.ResponseError("Error running script (call to f_0): @user_script:2: @user_script: 2: "
                                   "-OOM command not allowed when used memory > 'maxmemory'."),
    redis.exceptions.ResponseError("Error running script (call to f_0): @user_script:2: -READONLY You can't write"),
    redis.exceptions.ResponseError("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."),
])
def test_redis_not_answering_is_503_with_retry_after_and_no_traceback(client, monkeypatch, caplog, error):
    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(TaskStore, "create", fail)
    monkeypatch.setattr(Places, "read", fail)  # a status read: the task with its place in line
    for response in (client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}),
                     client.get(f"/api/v1/tasks/{uuid.uuid4()}")):
        assert response.status_code == 503 and response.headers["Retry-After"] == "5"
        assert response.headers["Content-Type"] == PROBLEM
        body = response.get_json()
        assert body["status"] == 503 and "retry" in body["detail"] and "script" not in body["detail"]
    assert caplog.records and all(r.exc_info is None for r in caplog.records)


def test_any_other_redis_error_is_still_a_500_with_its_traceback_logged(client, monkeypatch, caplog):
    def fail(*args, **kwargs):
        raise redis.exceptions.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")

    monkeypatch.setattr(Places, "read", fail)
    response = client.get(f"/api/v1/tasks/{uuid.uuid4()}")
    assert response.status_code == 500 and "WRONGTYPE" not in response.get_data(as_text=True)
    assert any(r.exc_info for r in caplog.records if r.levelno == logging.ERROR)


def b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@pytest.mark.parametrize("cursor", [
    b64(f"1700000000000:{2**63}"), b64(f"1700000000000:{2**64 + 5}"), b64("1:" + "9" * 5000), b64(f"{10**400}:0"),
    b64("1:²"), b64("١٧:٢"), b64("1:-1"), b64("inf:0"), "²", "%C2%B2", "@@@", "A" * 5000,
])
def test_garbage_cursors_are_422_naming_the_cursor(client, cursor):
    response = client.get(f"/api/v1/tasks?cursor={cursor}")
    assert response.status_code == 422 and response.headers["Content-Type"] == PROBLEM
    assert list(response.get_json()["errors"]) == ["cursor"]


class Chunked(io.RawIOBase):
    """A body of unknown length (not seekable), handed over in small reads as a socket would."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def]
        n = min(len(buffer), 8192, len(self.data))
        buffer[:n] = self.data[:n]
        self.data = self.data[n:]
        return n


def post_chunked(app, body: bytes) -> tuple[int, dict[str, str]]:
    """POST ``body`` with no Content-Length, the stream ended by the server: how gunicorn hands a chunked
    body over (the test client always sets a Content-Length)."""
    environ = EnvironBuilder(path="/api/v1/tasks", method="POST", content_type="application/json").get_environ()
    environ.pop("CONTENT_LENGTH", None)
    environ.update({"wsgi.input": Chunked(body), "wsgi.input_terminated": True, "HTTP_TRANSFER_ENCODING": "chunked"})
    _, status, headers = run_wsgi_app(app, environ, buffered=True)
    return int(status.split()[0]), dict(headers)


def test_a_chunked_body_over_the_limit_is_413_not_cut(app, config, conn):
    padded = orjson.dumps({"type": "demo.sleep", "payload": {}, "dedup_key": "x" * 100})
    padded += b" " * (config.max_body - len(padded))  # a valid JSON object of exactly the limit
    for body, status in ((padded, 202), (padded + b"garbage" * 1000, 413), (padded + b" ", 413)):
        got, headers = post_chunked(app, body)
        assert got == status
        if status == 413:
            assert headers["Content-Type"] == PROBLEM
    assert len(Histories(TaskStore(conn, config)).page("public", limit=10).tasks) == 1


def test_made_up_methods_share_one_metrics_series(client):
    for i in range(50):
        client.open("/api/v1/tasks", method=f"BREW{i}")
    client.get("/healthz")
    text = client.get("/metrics").get_data(as_text=True)
    series = [line for line in text.splitlines() if line.startswith("taskport_http_requests_total{")]
    assert not any("BREW" in line for line in series)
    assert any('method="other"' in line and 'status="405"' in line and line.endswith(" 50.0") for line in series)
    assert any('method="GET"' in line for line in series)


def make_tasks(store: TaskStore, n: int, type_: str = "demo.sleep") -> list[str]:
    made = []
    for _ in range(n):
        new = NewTask(task_id=str(uuid.uuid4()), member="public", type=type_, payload={},
                      dedup_digest=uuid.uuid4().hex, priority="default", max_attempts=1)
        store.create(new)
        made.append(new.task_id)
    return made


@pytest.mark.parametrize(("limit", "status", "most"), [(1, None, 1), (1, "FAILED", HISTORY_SCAN),
                                                        (50, "FAILED", 50 * HISTORY_SCAN), (20, None, 20)])
def test_a_history_page_reads_o_limit_hashes(store, monkeypatch, limit, status, most):
    make_tasks(store, 300)
    read: list[int] = []
    get_many = store.get_many
    monkeypatch.setattr(store, "get_many", lambda ids: read.append(len(ids)) or get_many(ids))
    page = Histories(store).page("public", limit=limit, status=status)
    assert read == [most]  # one pipeline, of at most HISTORY_SCAN * limit hashes
    assert page.next_cursor is not None


def test_a_filtered_walk_finds_every_match_through_partial_pages(store):
    made = make_tasks(store, 60)
    wanted = set(make_tasks(store, 3, type_="orders.split"))
    made += make_tasks(store, 60)
    seen: list[str] = []
    pages = 0
    cursor = None
    while True:
        page = Histories(store).page("public", limit=2, type_="orders.split", cursor=cursor, now=now_ms())
        pages += 1
        seen += [t.id for t in page.tasks]
        if not (cursor := page.next_cursor):
            break
    assert sorted(seen) == sorted(wanted)
    assert pages <= len(made) // (2 * HISTORY_SCAN) + 3  # each page moved HISTORY_SCAN * limit entries on
