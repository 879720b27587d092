"""Read tokens and CORS on real processes: two gunicorn webs sharing one valkey (a token minted on one reads on
the other), a restart of the web (tokens still count), ``taskport tokens rotate`` (every token 401 on every web),
a key removed (its tokens 401), every 401/403/404 rule, SSE and a result file with ``?access_token=``, CORS
preflights without a key while keys are on, and the access log with the token redacted."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from app.core import keys
from tests.integration.harness import Api, RedisServer, Stack, wait_until

KEYS = "ka:alice,kb:bob"
ORIGIN = "http://localhost:5173"
SETTINGS: dict[str, Any] = {"api_keys": KEYS, "cors_origins": ORIGIN, "worker_class": "simple"}
EXPORT = {"rows": 20, "format": "csv", "start_date": "2026-01-01", "end_date": "2026-01-31"}
TASKS = "/api/v1/tasks"


@pytest.fixture
def two(redis_server: RedisServer, redis_conn, tmp_path: Path, monkeypatch) -> Iterator[tuple[Stack, Stack]]:
    """Two webs (and one worker) on one Redis; web ``a`` writes gunicorn's access log to its output."""
    monkeypatch.setenv("GUNICORN_CMD_ARGS", "--access-logfile -")
    a, b = (Stack(redis_server.url, tmp_path / name, **SETTINGS) for name in ("a", "b"))
    try:
        a.start_web()
        monkeypatch.delenv("GUNICORN_CMD_ARGS")
        b.start_web()
        a.start_worker()
        yield a, b
    finally:
        a.teardown()
        b.teardown()


def alice(stack: Stack) -> Api:
    return Api(stack.base_url, "ka")


def read(stack: Stack, path: str, token: str, **kwargs: Any) -> requests.Response:
    return requests.get(stack.url(path), headers={"Authorization": f"Bearer {token}"}, timeout=10, **kwargs)


def submit_with_token(api: Api, type_: str = "demo.sleep", payload: dict[str, Any] | None = None) -> tuple[str, str]:
    answer = api.submit(type_, payload or {"seconds": 0.2, "steps": 2}, dedup_key=uuid.uuid4().hex, read_token=True)
    assert answer.status_code == 202, answer.text
    return answer.json()["task_id"], answer.json()["read_token"]["token"]


def rotate(stack: Stack) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app.launch.cli", "tokens", "rotate"], env=stack.environ("web"),
                          capture_output=True, text=True, timeout=30, check=False)


def test_a_token_minted_on_one_web_reads_on_the_other_and_survives_a_restart(two):
    a, b = two
    with alice(a) as api:
        task_id, token = submit_with_token(api)
    answer = read(b, f"{TASKS}/{task_id}", token)
    assert answer.status_code == 200 and answer.json()["task_id"] == task_id
    minted_on_b = requests.post(b.url(f"{TASKS}/{task_id}/tokens"), headers={"Authorization": "Bearer ka"},
                                json={"ttl": 60}, timeout=10).json()["token"]
    assert read(a, f"{TASKS}/{task_id}", minted_on_b).status_code == 200
    a.stop([p for p in a.procs if p.name.startswith("web")])
    a.start_web()
    assert read(a, f"{TASKS}/{task_id}", token).status_code == 200
    assert read(a, f"{TASKS}/{task_id}", minted_on_b).status_code == 200


def test_rotation_revokes_every_token_on_every_web(two, redis_conn):
    a, b = two
    with alice(a) as api:
        task_id, token = submit_with_token(api)
    assert read(a, f"{TASKS}/{task_id}", token).status_code == 200  # verified and kept by both webs
    assert read(b, f"{TASKS}/{task_id}", token).status_code == 200
    before = redis_conn.get(keys.TOKEN_SECRET)
    done = rotate(a)
    assert done.returncode == 0 and "rotated" in done.stdout, done.stderr
    assert redis_conn.get(keys.TOKEN_SECRET) not in (None, before)
    for web in (a, b):
        answer = wait_until(lambda web=web: [r for r in [read(web, f"{TASKS}/{task_id}", token)]
                                             if r.status_code == 401], timeout=10,
                            message="the rotated token to be refused")[0]  # a 4xx Response is falsy: in a list
        assert answer.headers["WWW-Authenticate"].startswith('Bearer error="invalid_token"')
        assert answer.headers["Content-Type"] == "application/problem+json"
    with alice(b) as api:
        fresh = api.post(f"{TASKS}/{task_id}/tokens").json()["token"]
    assert read(a, f"{TASKS}/{task_id}", fresh).status_code == 200


def test_removing_the_minting_key_revokes_its_tokens(two):
    a, b = two
    with alice(a) as api:
        task_id, token = submit_with_token(api)
    b.stop([p for p in b.procs if p.name.startswith("web")])
    b.configure(api_keys="kb:bob,kc:alice")
    b.start_web()
    answer = read(b, f"{TASKS}/{task_id}", token)
    assert answer.status_code == 401 and "no longer configured" in answer.json()["detail"]
    assert read(a, f"{TASKS}/{task_id}", token).status_code == 200  # a still has the key


def test_what_a_token_may_not_do(two):
    a, _ = two
    with alice(a) as api:
        task_id, token = submit_with_token(api)
        other = api.create("demo.sleep", {"seconds": 0.1}, dedup_key=uuid.uuid4().hex)
    auth = {"Authorization": f"Bearer {token}"}
    for method, path in (("DELETE", f"{TASKS}/{task_id}"), ("POST", f"{TASKS}/{task_id}/retry"), ("GET", TASKS),
                         ("POST", TASKS), ("GET", "/api/v1/schedules"), ("POST", f"{TASKS}/{task_id}/tokens")):
        answer = requests.request(method, a.url(path), headers=auth, json={}, timeout=10)
        assert answer.status_code == 403, (method, path, answer.text)
        assert answer.headers["WWW-Authenticate"] == 'Bearer error="insufficient_scope"'
    for path in (f"{TASKS}/{other}", f"{TASKS}/{other}/result", f"{TASKS}/{other}/events"):
        assert read(a, path, token).status_code == 404
    assert read(a, f"{TASKS}/{task_id}", token[:-3] + "AAA").status_code == 401
    assert read(a, f"{TASKS}/{task_id}", "tpr.nonsense").status_code == 401


def test_sse_and_the_result_file_with_the_query_parameter(two):
    a, b = two
    with alice(a) as api:
        task_id, token = submit_with_token(api, "orders.export", EXPORT)
    events: list[str] = []
    with requests.get(b.url(f"{TASKS}/{task_id}/events"), params={"access_token": token},
                      headers={"Origin": ORIGIN}, stream=True, timeout=30) as stream:
        assert stream.status_code == 200 and stream.headers["Access-Control-Allow-Origin"] == ORIGIN
        for line in stream.iter_lines(decode_unicode=True):
            if line.startswith("data:"):
                events.append(line)
    assert '"status":"COMPLETED"' in events[-1]
    # the file: from the web that shares the worker's data dir (each stack has its own)
    file = requests.get(a.url(f"{TASKS}/{task_id}/result/file"), params={"access_token": token},
                        headers={"Origin": ORIGIN}, timeout=10)
    assert file.status_code == 200 and file.content.count(b"\n") >= 20
    assert "Content-Disposition" in file.headers["Access-Control-Expose-Headers"]


def test_cors_preflight_without_a_key_and_a_foreign_origin(two):
    a, _ = two
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "GET",
                 "Access-Control-Request-Headers": "authorization, last-event-id"}
    answer = requests.options(a.url(f"{TASKS}/x/events"), headers=preflight, timeout=10)
    assert answer.status_code == 200 and answer.headers["Access-Control-Allow-Origin"] == ORIGIN
    assert "authorization" in answer.headers["Access-Control-Allow-Headers"].lower()
    assert "Origin" in answer.headers["Vary"]
    foreign = requests.options(a.url(f"{TASKS}/x"), headers={**preflight, "Origin": "http://evil.example"},
                               timeout=10)
    assert "Access-Control-Allow-Origin" not in foreign.headers
    with alice(a) as api:
        answer = api.get(TASKS, headers={"Origin": "http://evil.example"})
        assert answer.status_code == 200 and "Access-Control-Allow-Origin" not in answer.headers
    for path in ("/rq/", "/metrics", "/api/v1/audit"):
        answer = requests.options(a.url(path), headers=preflight, timeout=10)
        assert not [h for h in answer.headers if h.lower().startswith("access-control-")], path


def test_the_access_log_redacts_the_token(two):
    a, _ = two
    with alice(a) as api:
        task_id, token = submit_with_token(api)
    assert requests.get(a.url(f"{TASKS}/{task_id}"), params={"access_token": token}, timeout=10).status_code == 200
    web = next(p for p in a.procs if p.name.startswith("web"))
    line = wait_until(lambda: next((li for li in web.log().splitlines() if f"{task_id}?access_token" in li), None),
                      timeout=10, message="the access log line of the request")
    assert "access_token=[redacted]" in line
    assert token.split(".", 1)[1] not in web.log()
