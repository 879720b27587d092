"""The edges an adversarial probe found (issue 22), through real processes: a request body that stalls, the
``Retry-After`` the rate limiter used to rewrite, a Host header reflected into a redirect, gunicorn's 501 for
a transfer coding it does not know, an ``Idempotency-Key`` reused for another request or sent twice, a full
Redis, and an alert webhook that is no URL.

The module's stack runs in key mode (so the rate limiter is on) once under each gunicorn worker class, with a
one-second ``TASKPORT_WEB_IO_TIMEOUT`` so a stalled body is given up on quickly.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests

from app.core.config import Config, without_settings
from app.launch.embedded import EmbeddedRedis
from tests.integration.harness import REPO_ROOT, TASKS, Api, Stack, started_stack, wait_until

IO_TIMEOUT = 1.0  # seconds (TASKPORT_WEB_IO_TIMEOUT): a stalled body is given up on after this
OPERATOR = ("admin", "operator-secret")  # /metrics takes the operator's credentials in key mode
KEYS = "ka:alice,kb:bob,kc:carol,kd:dave"
CAP = 3  # TASKPORT_MAX_ACTIVE_TASKS
ACTIVE_CAP_RETRY_AFTER, STREAM_CAP_RETRY_AFTER = "5", "10"  # docs/api.md, docs/streams.md
STALL_LINE = "request body stalled"  # the one info line of a stalled body


@pytest.fixture(scope="module", params=["gevent", "gthread"])
def stack(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("edges"), web_worker_class=request.param, api_keys=KEYS,
                       web_io_timeout=IO_TIMEOUT, max_active_tasks=str(CAP), max_streams_per_member=1,
                       dashboard_password=OPERATOR[1]) as s:
        yield s


def web_log(stack: Stack) -> str:
    return "\n".join(p.log() for p in stack.procs if p.role == "web")


def raw_exchange(port: int, head: bytes, body: bytes = b"", timeout: float = 10.0) -> tuple[int, dict[str, str], bytes]:
    """Send ``head`` and ``body`` on a new connection and read until the server closes it: (status, headers,
    body). The server must close it (every answer here is ``Connection: close``)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    top, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, rest


def submit_head(key: str, length: int, extra: str = "") -> bytes:
    return (f"POST {TASKS} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n").encode("latin-1")


def http_requests(stack: Stack) -> dict[tuple[str, str], float]:
    """``taskport_http_requests_total`` of the web process: (endpoint, status) -> count."""
    text = requests.get(stack.url("/metrics"), auth=OPERATOR, timeout=10).text
    found: dict[tuple[str, str], float] = {}
    for endpoint, status, n in re.findall(
            r'^taskport_http_requests_total\{endpoint="([^"]+)",method="[^"]+",status="(\d+)"\} (\S+)$', text, re.M):
        found[(endpoint, status)] = found.get((endpoint, status), 0) + float(n)
    return found


def assert_problem(status: int, headers: dict[str, str], body: bytes, expected: int) -> dict[str, Any]:
    assert status == expected, (status, body)
    assert headers["content-type"] == "application/problem+json", headers
    problem: dict[str, Any] = orjson.loads(body)
    assert problem["status"] == expected and problem["title"] and problem["detail"], problem
    return problem


# -- 1. a body that stalls ------------------------------------------------------------------------------


def test_a_stalled_body_is_a_quiet_408_with_one_info_line(stack: Stack) -> None:
    before_log = web_log(stack)
    answers: list[tuple[float, tuple[int, dict[str, str], bytes] | OSError]] = []

    def stall() -> None:
        start = time.monotonic()
        try:
            answer: tuple[int, dict[str, str], bytes] | OSError = raw_exchange(
                stack.config.port, submit_head("ka", 1000), b"{", timeout=IO_TIMEOUT + 10)
        except OSError as exc:  # held past the deadline (socket.timeout), or reset
            answer = exc
        answers.append((time.monotonic() - start, answer))

    stalls = [threading.Thread(target=stall) for _ in range(3)]
    for t in stalls:
        t.start()
    for t in stalls:
        t.join()
    assert len(answers) == 3
    for took, answer in answers:
        assert not isinstance(answer, OSError), (took, answer)
        assert took < IO_TIMEOUT + 3, took  # given up on after the io timeout, not held
        status, headers, body = answer
        problem = assert_problem(status, headers, body, 408)
        assert headers["connection"] == "close"
        assert "body" in problem["detail"]
    def logged() -> str | None:
        log = web_log(stack)[len(before_log):]
        return log if log.count(STALL_LINE) >= 3 else None

    new = wait_until(logged, message=lambda: f"three {STALL_LINE!r} lines in:\n{web_log(stack)[len(before_log):]}")
    assert new.count(STALL_LINE) == 3, new
    assert "Traceback" not in new and "ERROR" not in new, new
    counted = http_requests(stack)
    assert counted.get(("tasks.submit", "408"), 0) >= 3, counted
    assert not [k for k in counted if k[1].startswith("5")], counted
    with Api(stack.base_url, "ka") as alice:  # and the web still answers
        assert alice.get(TASKS).status_code == 200


# -- 3. Retry-After is the contract's, not the limiter's --------------------------------------------------


def test_retry_after_is_the_documented_one_and_only_where_documented(stack: Stack) -> None:
    with Api(stack.base_url, "kb") as bob:
        seen: list[tuple[str, int, str | None]] = []
        for n in range(6):  # over a second or more of the limiter's windows (each task runs to its end)
            submitted = bob.submit("demo.sleep", {"seconds": 0.05 * n, "steps": 2})
            assert submitted.status_code == 202, submitted.text
            seen.append(("202", 202, submitted.headers.get("Retry-After")))
            task_id = submitted.json()["task_id"]

            def completed(task_id: str = task_id) -> requests.Response | None:
                polled = bob.get(f"{TASKS}/{task_id}")
                done = polled.json()["status"] == "COMPLETED"
                seen.append(("completed" if done else "active", polled.status_code, polled.headers.get("Retry-After")))
                return polled if done else None

            wait_until(completed, interval=0.05)  # a poller's pace: well under the limiter's 100/second
            result = bob.get(f"{TASKS}/{task_id}/result")
            seen.append(("result", result.status_code, result.headers.get("Retry-After")))
            missing = bob.get(f"{TASKS}/{uuid.uuid4()}")
            seen.append(("404", missing.status_code, missing.headers.get("Retry-After")))
        expected = {"202": "1", "active": "1", "completed": None, "result": None, "404": None}
        wrong = [s for s in seen if s[2] != expected[s[0]]]
        assert not wrong, wrong
        assert "X-RateLimit-Limit" in missing.headers  # the limiter's own headers are still there


def test_the_caps_429s_say_the_documented_retry_after(stack: Stack) -> None:
    with Api(stack.base_url, "kc") as carol:
        waiting = [carol.create("demo.sleep", {"steps": n}, delay=300) for n in range(1, CAP + 1)]  # unqueued
        over = carol.submit("demo.sleep", {"steps": CAP + 1}, delay=300)
        assert over.status_code == 429 and over.json()["limit"] == "max_active_tasks", over.text
        assert over.headers["Retry-After"] == ACTIVE_CAP_RETRY_AFTER
        with carol.get(f"{TASKS}/{waiting[0]}/events", stream=True) as first:
            assert first.status_code == 200
            second = carol.get(f"{TASKS}/{waiting[1]}/events")
            assert second.status_code == 429, second.text
            assert second.headers["Retry-After"] == STREAM_CAP_RETRY_AFTER
        for task_id in waiting:
            assert carol.delete(f"{TASKS}/{task_id}").status_code == 204


# -- 4. no Host header in a redirect ------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "target"), [("/docs", "/docs/"), ("/rq", "/rq/")])
def test_redirects_are_relative_whatever_the_host_header(stack: Stack, path: str, target: str) -> None:
    answer = requests.get(stack.url(path), headers={"Host": "evil.example"}, auth=OPERATOR, allow_redirects=False,
                          timeout=10)
    assert answer.status_code in (301, 302, 308), answer.status_code
    assert answer.headers["Location"] == target


# -- 5. gunicorn's 501 says what it is --------------------------------------------------------------------


def test_an_unknown_transfer_coding_is_a_501_problem_that_says_so(stack: Stack) -> None:
    head = (f"POST {TASKS} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ka\r\nContent-Type: application/json"
            "\r\nTransfer-Encoding: xchunked\r\n\r\n").encode()
    status, headers, body = raw_exchange(stack.config.port, head)
    problem = assert_problem(status, headers, body, 501)
    assert problem["title"] == "Not Implemented"
    assert "Transfer-Encoding" in problem["detail"] and "internal" not in problem["detail"]
    assert "Transfer-Encoding" in problem["errors"]
    assert b"xchunked" not in body  # the client's bytes are not echoed


# -- 6. Idempotency-Key: another request under the same key is 422; two keys are 400 -------------------------


def test_an_idempotency_key_reused_for_another_request_is_422(stack: Stack) -> None:
    key, body_key = f"idem-{uuid.uuid4().hex[:10]}", f"dedup-{uuid.uuid4().hex[:10]}"
    with Api(stack.base_url, "ka") as alice:
        first = alice.create("demo.sleep", {"steps": 1}, headers={"Idempotency-Key": key})
        again = alice.submit("demo.sleep", {"steps": 1}, headers={"Idempotency-Key": key})
        assert again.status_code == 409 and again.json()["task_id"] == first, again.text  # the same request
        other = alice.submit("demo.sleep", {"steps": 2}, headers={"Idempotency-Key": key})
        assert other.status_code == 422, other.text
        assert other.headers["Content-Type"] == "application/problem+json"
        assert list(other.json()["errors"]) == ["Idempotency-Key"]
        other_type = alice.submit("orders.split", {"order_code": "O-1", "items": [{"item_code": "A", "quantity": 1}]},
                                  headers={"Idempotency-Key": key})
        assert other_type.status_code == 422 and "Idempotency-Key" in other_type.json()["errors"]
        # a body dedup_key keeps its meaning: the same key is the same task, whatever the payload
        held = alice.create("demo.sleep", {"steps": 1}, dedup_key=body_key)
        same_key = alice.submit("demo.sleep", {"steps": 2}, dedup_key=body_key)
        assert same_key.status_code == 409 and same_key.json()["task_id"] == held, same_key.text


def test_two_idempotency_key_headers_are_400(stack: Stack) -> None:
    body = orjson.dumps({"type": "demo.sleep", "payload": {"steps": 1}})
    head = submit_head("ka", len(body), "Idempotency-Key: d1\r\nIdempotency-Key: d2\r\nConnection: close\r\n")
    status, headers, answer = raw_exchange(stack.config.port, head, body)
    problem = assert_problem(status, headers, answer, 400)
    assert "Idempotency-Key" in problem["errors"], problem


# -- 7. a bad alert webhook stops the process at start -------------------------------------------------------


@pytest.mark.parametrize("value", ["not a url", "file:///etc/passwd", "gopher://example.com/", "https://"])
def test_a_bad_alert_webhook_stops_the_process_with_one_line(tmp_path: Path, value: str) -> None:
    env = {**without_settings(os.environ), "TASKPORT_DATA_DIR": str(tmp_path), "REDIS_URL": "redis://127.0.0.1:1/0",
           "TASKPORT_REDIS_RIDE_OUT": "0.5", "TASKPORT_ALERT_WEBHOOK": value}
    done = subprocess.run([sys.executable, "-m", "app.launch.cli", "worker"], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("taskport: error: TASKPORT_ALERT_WEBHOOK must be"), done.stderr


# -- 2. a full Redis is a 503, not a 500 -----------------------------------------------------------------------


@pytest.fixture
def full_stack(tmp_path: Path) -> Iterator[tuple[Stack, EmbeddedRedis]]:
    """A web (no worker) on an embedded server whose maxmemory is tiny."""
    server = EmbeddedRedis(Config.from_env({}, data_dir=tmp_path / "redis", redis_maxmemory="4mb")).start()
    s = Stack(server.url, tmp_path / "stack", api_keys="ka:alice", dashboard_password=OPERATOR[1],
              rate_limit="off")
    try:
        s.start_web()
        yield s, server
    finally:
        s.teardown()
        server.close()


def test_the_embedded_server_is_bounded_and_a_full_one_answers_503(full_stack: tuple[Stack, EmbeddedRedis]) -> None:
    stack, server = full_stack
    with server.client() as conn:
        assert conn.config_get("maxmemory") == {"maxmemory": str(4 * 1024 * 1024)}
        assert conn.config_get("maxmemory-policy") == {"maxmemory-policy": "noeviction"}
    accepted: list[str] = []
    with Api(stack.base_url, "ka") as alice:
        for n in range(40):
            answer = alice.submit("demo.sleep", {"steps": n + 1, "fail_items": list(range(10**12, 10**12 + 20_000))})
            if answer.status_code != 202:
                break
            accepted.append(answer.json()["task_id"])
        assert accepted and answer.status_code == 503, (len(accepted), answer.status_code, answer.text)
        assert answer.headers["Content-Type"] == "application/problem+json"
        assert answer.headers["Retry-After"] == "5"
        assert "out of memory" in answer.json()["detail"]
        assert alice.get(f"{TASKS}/{accepted[0]}").status_code == 200  # reads still work
    log = web_log(stack)
    assert log.count("redis unavailable (OOM)") == 1, log
    assert "Traceback" not in log, log
    assert ("tasks.submit", "500") not in http_requests(stack)


# minutes of real processes and timeouts: `make test-slow` (CI runs it), which keeps `make test` within its budget
pytestmark = pytest.mark.slow
