"""The Python client (taskport.client) and the CLI (taskport submit|status|result|cancel|history|watch)
against the real stack: gunicorn, a real RQ worker, a real redis-server.

The CLI runs as a real process (``python -m app.launch.cli ...``, what the ``taskport`` console script runs)
configured only by TASKPORT_URL and TASKPORT_API_KEY; every documented exit code is produced here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskport import (
    Client,
    DuplicateTask,
    InvalidRequest,
    NotFound,
    StillRunning,
    TaskCancelled,
    TaskExpired,
    TaskFailed,
    Unauthorized,
)
from taskport import cli as tcli
from tests.integration.harness import REPO_ROOT, Stack, started_stack, wait_until
from tests.integration.proxy import DroppingProxy

KEY = "k-9clients"
CLI_TIMEOUT = 60


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Open mode, web + one fork worker (named ``stack`` so a failure's report has the process logs)."""
    with started_stack(tmp_path_factory.mktemp("clients")) as s:
        yield s


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """API keys on, tasks expire after 1 s, no worker (so a task stays PENDING until it EXPIREs)."""
    with started_stack(tmp_path_factory.mktemp("keyed"), worker=False, api_keys=f"{KEY}:acme", task_ttl=1) as s:
        yield s


@pytest.fixture
def client(stack: Stack) -> Iterator[Client]:
    with Client(stack.base_url) as c:
        yield c


def order(*items: dict[str, Any]) -> dict[str, Any]:
    return {"order_code": f"SO-{uuid.uuid4().hex[:8]}", "items": list(items)}


def sleep_task(seconds: float, **extra: Any) -> dict[str, Any]:
    """A demo.sleep payload: ``seconds`` in steps of 0.1 s unless ``extra`` says otherwise."""
    return {"seconds": seconds, "steps": max(1, int(seconds * 10)), **extra}


def fresh() -> str:
    """A unique idempotency key: demo.sleep payloads repeat, and a repeat within the window is a duplicate."""
    return uuid.uuid4().hex


def run_cli(url: str, *args: str, api_key: str | None = None) -> subprocess.CompletedProcess[str]:
    """``taskport ARGS`` as a real process, configured only by TASKPORT_URL (and TASKPORT_API_KEY)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKPORT_")}
    env.update({"TASKPORT_URL": url, "PYTHONPATH": str(REPO_ROOT), "COLUMNS": "120"})
    if api_key is not None:
        env["TASKPORT_API_KEY"] = api_key
    return subprocess.run([sys.executable, "-m", "app.launch.cli", *args], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=CLI_TIMEOUT)


# -- Python client ----------------------------------------------------------------------------------


def test_submit_wait_returns_the_result_with_the_partial_failure_code(client: Client) -> None:
    doc = client.submit("orders.split", order({"item_code": "A", "quantity": 2},
                                              {"item_code": "B", "quantity": 1, "bill_unpaid": True},
                                              {"item_code": "C", "quantity": 0}))
    assert doc["status"] == "PENDING"
    seen: list[str] = []
    result = client.wait(doc["task_id"], timeout=30, on_update=lambda d: seen.append(d["status"]))
    assert seen[-1] == "COMPLETED"
    assert result["items"] == {"total": 3, "succeeded": 1, "failed": 2}
    assert [(f["item"], f["code"]) for f in result["failures"]] == [("B", 10001), ("C", 10002)]
    assert result["error_code"] == 10002  # the last business code recorded
    assert client.status(doc["task_id"])["status"] == "COMPLETED"


def test_a_failed_task_raises_task_failed_with_its_business_code(client: Client) -> None:
    task_id = client.submit("orders.split", {**order({"item_code": "A", "quantity": 1}),
                                             "account_status": "suspended"})["task_id"]
    with pytest.raises(TaskFailed) as failed:
        client.wait(task_id, timeout=30)
    assert failed.value.code == 10001 and "bill unpaid" in failed.value.message
    with pytest.raises(TaskFailed) as again:  # /result answers 409: the same exception, same code
        client.result(task_id)
    assert again.value.code == 10001


def test_wait_honours_retry_after_and_gives_up_after_max_attempts(stack: Stack) -> None:
    naps: list[float] = []
    with Client(stack.base_url, sleep=naps.append) as c:  # no real sleeping: every poll answers at once
        task_id = c.submit("demo.sleep", sleep_task(30), idempotency_key=fresh())["task_id"]
        with pytest.raises(StillRunning) as still:
            c.wait(task_id, max_attempts=3)
        c.cancel(task_id)
    assert still.value.attempts == 3 and still.value.doc is not None
    assert still.value.doc["status"] in ("PENDING", "PROCESSING")
    assert naps == [1.0, 1.0]  # the service's Retry-After: 1, between the three reads


def test_wait_with_a_timeout_raises_still_running_and_cancel_ends_it(client: Client) -> None:
    task_id = client.submit("demo.sleep", sleep_task(30), idempotency_key=fresh())["task_id"]
    with pytest.raises(StillRunning):
        client.wait(task_id, timeout=1.5, sse=True)
    client.cancel(task_id)
    with pytest.raises(TaskCancelled):
        client.wait(task_id, timeout=10)
    with pytest.raises(TaskCancelled):
        client.result(task_id)


def test_follow_streams_progress_to_the_end(client: Client) -> None:
    payload = sleep_task(1.5, items=15, fail_items=[4])
    task_id = client.submit("demo.sleep", payload, idempotency_key=fresh())["task_id"]
    docs = list(client.follow(task_id, timeout=30))
    progress = [d["progress"] for d in docs]
    assert progress == sorted(progress) and progress[-1] == 100 and len(docs) >= 3
    assert docs[-1]["status"] == "COMPLETED" and docs[-1]["items"]["failed"] == 1


def test_a_dropped_event_stream_is_resumed_with_last_event_id(stack: Stack, client: Client) -> None:
    proxy = DroppingProxy(stack.config.port)
    try:
        task_id = client.submit("demo.sleep", sleep_task(3, steps=30), idempotency_key=fresh())["task_id"]
        with Client(proxy.url) as through_proxy:
            events = through_proxy.events(task_id)
            before = [next(events), next(events)]
            assert proxy.drop() >= 1
            after = list(events)
    finally:
        proxy.close()
    ids = [e.id for e in before + after]
    assert all(isinstance(i, int) for i in ids) and ids == sorted(set(ids)), ids  # nothing re-sent
    assert after[-1].doc["status"] == "COMPLETED"
    streams = [r for r in proxy.requests if f"/tasks/{task_id}/events" in r]
    assert len(streams) >= 2 and "last-event-id" not in streams[0].lower()
    resumed = [line for line in streams[1].split("\r\n") if line.lower().startswith("last-event-id:")]
    assert resumed and int(resumed[0].split(":")[1]) in ids, streams[1]  # the last id the client had seen


def test_history_iterates_pages_and_download_saves_the_file(client: Client, tmp_path: Path) -> None:
    ids = [client.submit("orders.export", {"rows": 5 + i, "format": "csv"})["task_id"] for i in range(3)]
    for task_id in ids:
        client.wait(task_id, timeout=30)
    listed = [d["task_id"] for d in client.history(type="orders.export", page_size=2)]
    assert listed[:3] == ids[::-1]
    saved = client.download(ids[0], tmp_path)
    assert saved.parent == tmp_path and saved.suffix == ".csv"
    assert len(saved.read_text().splitlines()) == 1 + 5
    named = client.download(ids[1], tmp_path / "mine.csv")
    assert named == tmp_path / "mine.csv" and len(named.read_text().splitlines()) == 1 + 6
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".part")] == []


def test_problems_become_typed_exceptions(client: Client, stack: Stack) -> None:
    with pytest.raises(InvalidRequest) as invalid:
        client.submit("orders.split", order({"item_code": "A", "quantity": "many"}))
    assert invalid.value.status == 422 and "payload.items.0.quantity" in invalid.value.errors
    with pytest.raises(NotFound) as missing:
        client.status(str(uuid.uuid4()))
    assert missing.value.detail == "task not found or expired"
    payload = order({"item_code": "A", "quantity": 1})
    first = client.submit("orders.split", payload, idempotency_key=payload["order_code"])
    with pytest.raises(DuplicateTask) as dup:
        client.submit("orders.split", payload, idempotency_key=payload["order_code"])
    assert dup.value.task_id == first["task_id"] and dup.value.existing["task_id"] == first["task_id"]


def test_keys_and_expiry(keyed: Stack) -> None:
    with Client(keyed.base_url) as anonymous, pytest.raises(Unauthorized):
        anonymous.submit("demo.sleep", {})
    with Client(keyed.base_url, api_key=KEY) as c:
        task_id = c.submit("demo.sleep", {}, idempotency_key=fresh())["task_id"]
        expired = wait_until(lambda: c.status(task_id)["status"] == "EXPIRED", timeout=10)
        assert expired
        with pytest.raises(TaskExpired) as gone:
            c.wait(task_id, timeout=5)
        assert gone.value.code == -4
        assert list(c.events(task_id))[-1].doc["status"] == "EXPIRED"


# -- CLI --------------------------------------------------------------------------------------------


def test_cli_submit_wait_shows_progress_and_the_failure_table_exit_3(stack: Stack, tmp_path: Path) -> None:
    payload = tmp_path / "order.json"
    payload.write_text(json.dumps(order({"item_code": "A", "quantity": 1}, {"item_code": "Z", "quantity": 0},
                                        {"item_code": "P", "quantity": 1, "bill_unpaid": True})))
    done = run_cli(stack.base_url, "submit", "orders.split", "--payload", f"@{payload}", "--wait")
    assert done.returncode == tcli.PARTIAL, done
    assert "submitted " in done.stderr and "COMPLETED" in done.stderr and "100%" in done.stderr
    assert "1 ok, 2 failed of 3" in done.stderr
    assert "error_code: 10001" in done.stdout and "failed items" in done.stdout
    assert "10002" in done.stdout and "bill unpaid" in done.stdout


def test_cli_json_and_exit_0_for_a_clean_completion(stack: Stack) -> None:
    done = run_cli(stack.base_url, "submit", "demo.sleep", "--payload", json.dumps(sleep_task(0.2)),
                   "--idempotency-key", fresh(), "--wait", "--json")
    assert done.returncode == tcli.OK, done
    body = json.loads(done.stdout)
    assert body["status"] == "COMPLETED" and body["error_code"] is None and body["failures"] == []
    shown = run_cli(stack.base_url, "status", body["task_id"], "--json")
    assert shown.returncode == tcli.OK and json.loads(shown.stdout)["progress"] == 100
    listed = run_cli(stack.base_url, "history", "--status", "completed", "--limit", "1", "--json")
    assert listed.returncode == tcli.OK and len(json.loads(listed.stdout)) == 1


def test_cli_failed_task_exit_4(stack: Stack) -> None:
    done = run_cli(stack.base_url, "submit", "demo.sleep", "--payload", json.dumps(sleep_task(0.1, fail_code=10001)),
                   "--idempotency-key", fresh(), "--wait")
    assert done.returncode == tcli.FAILED, done
    assert "FAILED" in done.stderr and "code 10001" in done.stderr and "Traceback" not in done.stderr


def test_cli_still_running_exit_7_cancel_then_exit_5(stack: Stack) -> None:
    started = run_cli(stack.base_url, "submit", "demo.sleep", "--payload", json.dumps(sleep_task(30)),
                      "--idempotency-key", fresh())
    assert started.returncode == tcli.OK, started
    task_id = started.stdout.strip()
    waited = run_cli(stack.base_url, "watch", task_id, "--timeout", "1")
    assert waited.returncode == tcli.STILL_RUNNING, waited
    assert "still" in waited.stderr and "check its status or the history later" in waited.stderr
    assert run_cli(stack.base_url, "status", task_id).returncode == tcli.STILL_RUNNING
    cancelled = run_cli(stack.base_url, "cancel", task_id)
    assert cancelled.returncode == tcli.OK and f"cancelled {task_id}" in cancelled.stdout
    assert run_cli(stack.base_url, "watch", task_id).returncode == tcli.CANCELLED
    assert run_cli(stack.base_url, "result", task_id).returncode == tcli.CANCELLED
    again = run_cli(stack.base_url, "cancel", task_id)
    assert again.returncode == tcli.ERROR and "409" in again.stderr


def test_cli_result_output_saves_the_file(stack: Stack, tmp_path: Path) -> None:
    done = run_cli(stack.base_url, "submit", "orders.export", "--payload", '{"rows": 3}', "--wait", "--json")
    assert done.returncode == tcli.OK, done
    task_id = json.loads(done.stdout)["task_id"]
    saved = run_cli(stack.base_url, "result", task_id, "--output", str(tmp_path))
    assert saved.returncode == tcli.OK, saved
    files = list(tmp_path.glob("*.csv"))
    assert len(files) == 1 and f"saved {files[0]}" in saved.stderr
    assert len(files[0].read_text().splitlines()) == 4


def test_cli_usage_errors_exit_2(stack: Stack) -> None:
    bad_json = run_cli(stack.base_url, "submit", "demo.sleep", "--payload", "{nope")
    assert bad_json.returncode == tcli.USAGE and "not valid JSON" in bad_json.stderr
    rejected = run_cli(stack.base_url, "submit", "demo.sleep", "--payload", '{"seconds": -1}')
    assert rejected.returncode == tcli.USAGE and "payload.seconds" in rejected.stderr
    unknown_flag = run_cli(stack.base_url, "status")
    assert unknown_flag.returncode == tcli.USAGE
    for outcome in (bad_json, rejected, unknown_flag):
        assert "Traceback" not in outcome.stderr


def test_cli_errors_exit_1_without_a_traceback(stack: Stack, keyed: Stack) -> None:
    missing = run_cli(stack.base_url, "status", str(uuid.uuid4()))
    assert missing.returncode == tcli.ERROR and "404" in missing.stderr
    unreachable = run_cli("http://127.0.0.1:9", "history")
    assert unreachable.returncode == tcli.ERROR and "no answer from http://127.0.0.1:9" in unreachable.stderr
    no_key = run_cli(keyed.base_url, "history")
    assert no_key.returncode == tcli.ERROR and "401" in no_key.stderr
    for outcome in (missing, unreachable, no_key):
        assert "Traceback" not in outcome.stderr


def test_cli_api_key_from_the_environment_and_expired_exit_6(keyed: Stack) -> None:
    started = run_cli(keyed.base_url, "submit", "demo.sleep", "--idempotency-key", fresh(), api_key=KEY)
    assert started.returncode == tcli.OK, started
    task_id = started.stdout.strip()
    wait_until(lambda: run_cli(keyed.base_url, "status", task_id, api_key=KEY).returncode == tcli.EXPIRED,
               timeout=15, interval=0.2, message="the task to expire")
    assert run_cli(keyed.base_url, "watch", task_id, api_key=KEY).returncode == tcli.EXPIRED
    assert run_cli(keyed.base_url, "result", task_id, api_key=KEY).returncode == tcli.EXPIRED
