"""Bounded answers against real servers: a real redis-server that is full (maxmemory + noeviction) or
read-only answers 503 + Retry-After through the real web (no traceback in its log); gunicorn hands a
chunked body over the limit to the app, which answers 413; garbage cursors, made-up methods and
out-of-range export dates are bounded; a history page costs O(limit) Redis commands, counted by the
server itself (INFO commandstats).
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis
import requests

from app.core.answers import NewTask
from app.core.config import Config
from app.core.history import HISTORY_SCAN, Histories
from app.core.process import free_port
from app.core.store import TaskStore
from tests.integration.harness import TASKS, Api, RedisServer, Stack

MAX_BODY = 20_000


@pytest.fixture
def private(redis_factory: Callable[..., RedisServer], tmp_path: Path) -> Iterator[tuple[RedisServer, Stack]]:
    """A web process on a redis-server of its own (the test makes that server full or read-only)."""
    server = redis_factory()
    stack = Stack(server.url, tmp_path / "stack", max_body=MAX_BODY)
    try:
        stack.start_web()
        yield server, stack
    finally:
        stack.teardown()


def assert_503(response: requests.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] and response.headers["Content-Type"] == "application/problem+json"
    assert "retry" in response.json()["detail"] and "script" not in response.text


def test_a_full_or_read_only_redis_is_503_never_500(private: tuple[RedisServer, Stack]) -> None:
    server, stack = private
    conn = server.client()
    with Api(stack.base_url) as api:
        existing = api.create("demo.sleep", {"steps": 1})
        conn.config_set("maxmemory-policy", "noeviction")
        conn.config_set("maxmemory", "1")  # a byte: every write is refused with OOM
        try:
            assert_503(api.submit("demo.sleep", {"steps": 2}))
            assert api.get(f"{TASKS}/{existing}").status_code == 200  # reads still work
        finally:
            conn.config_set("maxmemory", "0")
        assert api.submit("demo.sleep", {"steps": 3}).status_code == 202

        conn.replicaof("127.0.0.1", str(free_port()))  # a replica of nothing: read-only, keeps its data
        try:
            assert_503(api.submit("demo.sleep", {"steps": 4}))
            assert_503(api.delete(f"{TASKS}/{existing}"))
            assert api.get(f"{TASKS}/{existing}").status_code == 200
        finally:
            conn.replicaof("NO", "ONE")
        assert api.delete(f"{TASKS}/{existing}").status_code == 204
    log = stack.procs[0].log()
    assert "redis unavailable (OOM)" in log and "redis unavailable (READONLY)" in log
    assert "Traceback" not in log
    conn.close()


def chunks(data: bytes, size: int = 4096) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i:i + size]


def test_http_bounds_through_gunicorn(private: tuple[RedisServer, Stack]) -> None:
    _, stack = private
    url = stack.url(TASKS)
    padded = orjson.dumps({"type": "demo.sleep", "payload": {}})
    padded += b" " * (MAX_BODY - len(padded))
    headers = {"Content-Type": "application/json"}
    # requests sends a generator as Transfer-Encoding: chunked, with no Content-Length
    over = requests.post(url, data=chunks(padded + b"garbage" * 100), headers=headers, timeout=10)
    assert over.status_code == 413 and over.headers["Content-Type"] == "application/problem+json"
    assert requests.post(url, data=chunks(padded), headers=headers, timeout=10).status_code == 202

    with Api(stack.base_url) as api:
        for raw in (f"1700000000000:{2**63 + 1}", "1:²", "1:" + "9" * 2500):  # gunicorn: lines < 4 KiB
            cursor = base64.urlsafe_b64encode(raw.encode()).decode()
            response = api.get(TASKS, params={"cursor": cursor})
            assert response.status_code == 422 and list(response.json()["errors"]) == ["cursor"], response.text
        export = api.submit("orders.export", {"rows": 1, "start_date": "0001-01-01", "end_date": "9999-12-31"})
        assert export.status_code == 422 and set(export.json()["errors"]) == {"payload.start_date",
                                                                            "payload.end_date"}
        for i in range(20):
            api.request(f"MADEUP{i}", TASKS)
        metrics = api.get("/metrics").text
    assert "MADEUP" not in metrics and 'method="other"' in metrics
    assert "Traceback" not in stack.procs[0].log()


def commands(conn: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = conn.info("commandstats")
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items()}


def test_a_history_page_costs_o_limit_commands(redis_conn: redis.Redis, tmp_path: Path) -> None:
    store = TaskStore(redis_conn, Config.from_env({}, redis_url="redis://unused", data_dir=tmp_path))
    for _ in range(1500):
        new = NewTask(task_id=str(uuid.uuid4()), member="public", type="demo.sleep", payload={},
                      dedup_digest=uuid.uuid4().hex, priority="default", max_attempts=1)
        store.create(new)
    figures = []
    for limit, status in ((1, "FAILED"), (1, None), (50, "FAILED"), (50, None), (200, "FAILED")):
        before = commands(redis_conn)
        page = Histories(store).page("public", limit=limit, status=status)
        after = commands(redis_conn)
        spent = sum(v - before.get(k, 0) for k, v in after.items() if k != "info")
        bound = 1 + (HISTORY_SCAN * limit if status else limit)
        figures.append((limit, status, spent))
        assert spent <= bound, figures
        assert page.next_cursor is not None and len(page.tasks) == (0 if status else limit)
    print(f"history page commands (limit, filter, commands): {figures}")
