"""The edges an adversarial probe found (issue 22), at the unit level: the embedded server's maxmemory and the
alert webhook checked at start, the rate limiter's Retry-After kept on its own 429, relative redirects,
gunicorn's 501 as a problem that says what was wrong, a stalled body as a 408, and Idempotency-Key's
refusals. The same edges through real processes: tests/integration/test_edges.py."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.core.config import Config, ConfigError
from app.launch.embedded import EmbeddedRedis
from app.web import create_app
from app.web.errors import BodyStalled
from app.web.limits import LIMITER_RETRY_AFTER
from app.web.webworker import TimedBody, write_problem

TASKS = "/api/v1/tasks"


def keyed_client(tmp_path: Path, conn: Any, **env: str) -> Any:
    config = Config.from_env({"TASKPORT_API_KEYS": "ka:alice", **env}, redis_url="redis://fake", data_dir=tmp_path)
    return create_app(config, conn=conn).test_client()


ALICE = {"Authorization": "Bearer ka"}


# -- the embedded server's memory -----------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "size"), [("", 1024**3), ("1gb", 1024**3), ("512MB", 512 * 1024**2),
                                           ("64kb", 64 * 1024), ("123456", 123456), ("0", 0)])
def test_redis_maxmemory_is_read_in_redis_units(raw: str, size: int) -> None:
    assert Config.from_env({"TASKPORT_REDIS_MAXMEMORY": raw}).redis_maxmemory_bytes == size


@pytest.mark.parametrize("raw", ["lots", "1.5gb", "-1", "1tb", "gb"])
def test_a_bad_redis_maxmemory_stops_the_process_naming_it(raw: str) -> None:
    with pytest.raises(ConfigError, match="^TASKPORT_REDIS_MAXMEMORY "):
        Config.from_env({"TASKPORT_REDIS_MAXMEMORY": raw})


def test_the_embedded_server_runs_bounded_and_never_evicts(tmp_path: Path) -> None:
    command = EmbeddedRedis(Config.from_env({}, data_dir=tmp_path), executable="valkey-server").command()
    assert command[command.index("--maxmemory") + 1] == str(1024**3)
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    small = EmbeddedRedis(Config.from_env({"TASKPORT_REDIS_MAXMEMORY": "4mb"}, data_dir=tmp_path), executable="x")
    assert small.command()[small.command().index("--maxmemory") + 1] == str(4 * 1024**2)


# -- the alert webhook ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["not a url", "file:///etc/passwd", "gopher://example.com/", "https://",
                                 "ftp://example.com/hook", "http://[::1", "http://example.com:99999/",
                                 "https://hooks.example.com/a b", "//example.com/hook"])
def test_a_bad_alert_webhook_stops_the_process_without_showing_it(url: str) -> None:
    with pytest.raises(ConfigError, match="^TASKPORT_ALERT_WEBHOOK must be an http:// or https:// URL") as caught:
        Config.from_env({"TASKPORT_ALERT_WEBHOOK": url})
    assert str(caught.value).endswith("with a host name")  # not the value: a webhook URL often carries its secret


@pytest.mark.parametrize("url", ["", "https://hooks.example.com/services/T0/B0/xyz", "http://127.0.0.1:8080/alert",
                                 "HTTPS://Example.COM", "http://[::1]:9000/"])
def test_an_http_or_https_webhook_with_a_host_is_accepted(url: str) -> None:
    assert Config.from_env({"TASKPORT_ALERT_WEBHOOK": url}).alert_webhook == url


# -- Retry-After: the limiter's only on its own 429 -----------------------------------------------------------


def test_the_limiters_retry_after_is_on_its_429_only(tmp_path: Path, conn: Any) -> None:
    client = keyed_client(tmp_path, conn, TASKPORT_RATE_LIMIT="4/minute")
    submitted = client.post(TASKS, json={"type": "demo.sleep"}, headers=ALICE)
    assert submitted.status_code == 202 and submitted.headers["Retry-After"] == "1"
    polled = client.get(f"{TASKS}/{submitted.get_json()['task_id']}", headers=ALICE)
    assert polled.status_code == 200 and polled.headers["Retry-After"] == "1"  # not the window's ~59 s
    missing = client.get(f"{TASKS}/00000000-0000-4000-8000-000000000000", headers=ALICE)
    assert missing.status_code == 404 and "Retry-After" not in missing.headers
    assert missing.headers["X-RateLimit-Limit"] == "4"  # the limiter's own headers stay
    assert [client.get(TASKS, headers=ALICE).status_code for _ in range(4)] == [200] * 4
    over = client.get(TASKS, headers=ALICE)
    assert over.status_code == 429 and over.content_type == "application/problem+json"
    assert 1 <= int(over.headers["Retry-After"]) <= 60
    for answer in (submitted, polled, missing, over):
        assert LIMITER_RETRY_AFTER not in answer.headers


def test_the_active_cap_429_keeps_its_own_retry_after(tmp_path: Path, conn: Any) -> None:
    client = keyed_client(tmp_path, conn, TASKPORT_MAX_ACTIVE_TASKS="1")
    assert client.post(TASKS, json={"type": "demo.sleep", "payload": {"steps": 1}}, headers=ALICE).status_code == 202
    over = client.post(TASKS, json={"type": "demo.sleep", "payload": {"steps": 2}}, headers=ALICE)
    assert over.status_code == 429 and over.get_json()["limit"] == "max_active_tasks"
    assert over.headers["Retry-After"] == "5"


# -- redirects --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "location"), [("/docs", "/docs/"), ("/docs?x=1", "/docs/?x=1")])
def test_a_routing_redirect_is_relative_whatever_the_host(tmp_path: Path, conn: Any, path: str,
                                                          location: str) -> None:
    client = keyed_client(tmp_path, conn)
    answer = client.get(path, headers={"Host": "evil.example"})
    assert answer.status_code == 308 and answer.headers["Location"] == location


# -- gunicorn's own answers -----------------------------------------------------------------------------------


def written_problem(status: int, reason: str) -> tuple[str, dict[str, Any]]:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        write_problem(ours, status, reason, "Unsupported transfer coding: 'xchunked'")
        ours.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := theirs.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.decode().split("\r\n")[0], orjson.loads(body)


def test_gunicorns_501_is_a_problem_that_says_what_was_wrong() -> None:
    status_line, problem = written_problem(501, "Bad Request")  # the reason gunicorn passes with its 501
    assert status_line == "HTTP/1.1 501 Not Implemented"
    assert (problem["status"], problem["title"]) == (501, "Not Implemented")
    assert problem["type"] == "/problems/not-implemented"
    assert "Transfer-Encoding" in problem["detail"] and "internal" not in problem["detail"]
    assert problem["errors"] == {"Transfer-Encoding": ["Only chunked is supported."]}
    assert "xchunked" not in orjson.dumps(problem).decode()


def test_gunicorns_other_answers_keep_their_titles() -> None:
    assert written_problem(400, "Bad Request")[1]["title"] == "Bad Request"
    assert written_problem(431, "Request Header Fields Too Large")[0] == "HTTP/1.1 431 Request Header Fields Too Large"
    assert written_problem(414, "URI Too Long")[1]["title"] == "URI Too Long"  # RFC 9110's name, kept


# -- a stalled body ---------------------------------------------------------------------------------------------


class StallingBody:
    def read(self, *size: int | None) -> bytes:
        raise TimeoutError("timed out")

    readline = read


class Req:
    def __init__(self) -> None:
        self.body: Any = StallingBody()
        self.must_close = False


def test_a_stalled_body_is_408_with_one_info_line_and_closes(caplog: pytest.LogCaptureFixture) -> None:
    req = Req()
    original = req.body
    with caplog.at_level(logging.INFO, logger="app.web.webworker"), TimedBody(req, ("10.0.0.7", 5555), 2.0):
        with pytest.raises(BodyStalled) as stalled:
            req.body.read(1000)
    assert req.body is original  # gunicorn drains what is left with its own body, and its own timeouts
    assert req.must_close  # gunicorn answers Connection: close and closes once the 408 is written
    assert (stalled.value.status, stalled.value.slug) == (408, "request-timeout") and "2 s" in stalled.value.detail
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["request body stalled: no byte from 10.0.0.7 for 2 s; answered 408 and closed"]


# -- Idempotency-Key ------------------------------------------------------------------------------------------------


def test_two_idempotency_key_headers_are_400_naming_it(client: Any) -> None:
    for header in ("d1,d2", "d1, d2"):  # what two headers become, joined by the server
        answer = client.post(TASKS, json={"type": "demo.sleep"}, headers={"Idempotency-Key": header})
        assert answer.status_code == 400 and answer.content_type == "application/problem+json"
        assert list(answer.get_json()["errors"]) == ["Idempotency-Key"]
    assert client.get(TASKS).get_json()["tasks"] == []


def test_an_idempotency_key_reused_for_another_type_is_422_but_a_body_key_is_a_duplicate(client: Any) -> None:
    first = client.post(TASKS, json={"type": "demo.sleep"}, headers={"Idempotency-Key": "k1"})
    assert first.status_code == 202
    again = client.post(TASKS, json={"type": "demo.sleep"}, headers={"Idempotency-Key": "k1"})
    assert again.status_code == 409 and again.get_json()["task_id"] == first.get_json()["task_id"]
    other = client.post(TASKS, json={"type": "orders.split", "payload": {
        "order_code": "O-1", "items": [{"item_code": "A", "quantity": 1}]}}, headers={"Idempotency-Key": "k1"})
    assert other.status_code == 422 and list(other.get_json()["errors"]) == ["Idempotency-Key"]
    by_body = client.post(TASKS, json={"type": "orders.split", "dedup_key": "k1", "payload": {
        "order_code": "O-1", "items": [{"item_code": "A", "quantity": 1}]}})
    assert by_body.status_code == 409 and by_body.get_json()["task_id"] == first.get_json()["task_id"]
