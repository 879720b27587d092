"""What waits (app.core.backlog), as /metrics shows it: each queue's oldest waiting job's age, the tasks waiting for
their time and for other tasks (keys.WAITING, kept by the scripts), the callback deliveries due; fakeredis."""

from __future__ import annotations

import uuid
from datetime import timedelta

from rq.job import Job
from rq.utils import now, utcformat

from app.core import backlog, deferred, keys
from app.core.clock import now_ms
from app.core.jobs import JobQueue
from app.core.store import TaskStore
from tests.unit.test_metrics import scrape

SLEEP = {"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1}}


def submit(client, **extra) -> str:
    answer = client.post("/api/v1/tasks", json={**SLEEP, "dedup_key": uuid.uuid4().hex, **extra})
    assert answer.status_code == 202, answer.get_json()
    return str(answer.get_json()["task_id"])


def queued_at(conn, job_id: str, seconds_ago: float) -> None:
    """Say the job was queued ``seconds_ago``."""
    conn.hset(Job.key_for(job_id), "enqueued_at", utcformat(now() - timedelta(seconds=seconds_ago)))


def test_nothing_waits_on_a_fresh_redis(conn) -> None:
    assert backlog.read(conn) == backlog.Backlog({"high": 0.0, "default": 0.0, "low": 0.0}, 0, 0, 0, 0)


def test_the_oldest_age_is_the_head_job_s_time_on_its_queue(client, conn) -> None:
    first, second = submit(client), submit(client)
    queued_at(conn, first, 90)
    queued_at(conn, second, 30)
    ages = backlog.read(conn).oldest_age
    assert 89 <= ages["default"] <= 92 and ages["high"] == ages["low"] == 0
    submit(client, priority="low")
    assert 0 <= backlog.read(conn).oldest_age["low"] < 2


def test_a_job_whose_task_is_no_longer_pending_is_passed_over(client, conn, config) -> None:
    """A cancel whose job removal was lost (the web process died between its two steps: the transition alone here)
    leaves the job at the head: it waits for nothing, so the age is the next live job's, and 0 with none, however
    long it stays."""
    store = TaskStore(conn, config)
    dead, live = submit(client), submit(client)
    queued_at(conn, dead, 600)
    queued_at(conn, live, 60)
    store.cancel(dead)
    assert 59 <= backlog.read(conn).oldest_age["default"] <= 62
    store.cancel(live)
    assert conn.llen("rq:queue:default") == 2 and backlog.read(conn).oldest_age["default"] == 0


def test_past_the_scan_it_reads_the_last_id_looked_at(client, conn, config) -> None:
    """More dead heads than it looks at, and jobs may wait behind: never 0, the last one's age (an upper bound)."""
    store = TaskStore(conn, config)
    for n in range(backlog.SCAN):
        task_id = submit(client)
        queued_at(conn, task_id, 500 - n)
        store.cancel(task_id)
    queued_at(conn, submit(client), 10)
    assert 500 - backlog.SCAN <= backlog.read(conn).oldest_age["default"] <= 500 - backlog.SCAN + 3


def test_tasks_waiting_for_their_time_and_for_other_tasks_are_counted(client, conn, config) -> None:
    store, jobs = TaskStore(conn, config), JobQueue(conn, config)
    parent = submit(client)
    later = submit(client, delay=60)
    child, cancelled = submit(client, after=[parent]), submit(client, after=[parent])
    assert (backlog.read(conn).delayed, backlog.read(conn).after) == (1, 2)
    assert conn.zscore(keys.WAITING, child) is not None
    assert client.delete(f"/api/v1/tasks/{cancelled}").status_code == 204  # leaving PENDING, it waits no more
    assert backlog.read(conn).after == 1
    store.start(parent, "r1")
    store.complete(parent, "r1", None, items=None, failures=[], error_code=None)
    assert deferred.settle_all(store, jobs, now_ms()) == {"released": 1, "failed": 0}
    assert backlog.read(conn).after == 0 and conn.zcard(keys.WAITING) == 0
    assert deferred.promote_all_due(store, jobs, now_ms() + 61_000) == 1
    assert backlog.read(conn).delayed == 0 and later


def test_a_task_after_one_that_failed_leaves_the_count_when_it_fails_too(client, conn, config) -> None:
    store, jobs = TaskStore(conn, config), JobQueue(conn, config)
    parent = submit(client)
    child = submit(client, after=[parent])
    store.start(parent, "r1")
    store.fail(parent, "r1", 10001, "no")
    deferred.settle_all(store, jobs, now_ms())
    assert client.get(f"/api/v1/tasks/{child}").get_json()["status"] == "FAILED"
    assert backlog.read(conn).after == 0


def test_a_batch_s_then_task_waits_until_the_batch_is_done_and_again_when_run_again(client, conn, config) -> None:
    store = TaskStore(conn, config)
    answer = client.post("/api/v1/batches", json={"tasks": [SLEEP], "then": {"type": "batch.summary", "payload": {}}})
    assert answer.status_code == 202, answer.get_json()
    doc = answer.get_json()
    (task_id,), then_id = [t["task_id"] for t in doc["tasks"]], doc["then_task_id"]
    assert backlog.read(conn).after == 1 and conn.zscore(keys.WAITING, then_id) is not None
    store.start(task_id, "r1")
    store.complete(task_id, "r1", None, items=None, failures=[], error_code=None)
    assert backlog.read(conn).after == 0  # released: due now, in keys.DELAYED until the promote tick
    assert backlog.read(conn).delayed == 1


def test_callbacks_due_now_and_later(conn) -> None:
    conn.zadd(keys.CALLBACKS_DUE, {"t:a:3:COMPLETED": now_ms() - 5_000, "t:b:4:FAILED": now_ms() + 60_000})
    read = backlog.read(conn)
    assert (read.callbacks_due_now, read.callbacks_due_later) == (1, 1)


def test_metrics_show_the_backlog(client, conn) -> None:
    queued_at(conn, submit(client), 42)
    submit(client, delay=60)
    samples = scrape(client)
    assert 41 <= samples[("taskport_queue_oldest_age_seconds", (("queue", "default"),))] <= 44
    assert samples[("taskport_queue_oldest_age_seconds", (("queue", "high"),))] == 0
    assert samples[("taskport_tasks_waiting", (("reason", "run_at"),))] == 1
    assert samples[("taskport_tasks_waiting", (("reason", "after"),))] == 0
    assert samples[("taskport_callbacks_due", (("when", "now"),))] == 0
    assert samples[("taskport_callbacks_due", (("when", "later"),))] == 0


def test_a_server_that_lost_its_scripts_loads_it_again(conn) -> None:
    backlog.read(conn)
    conn.script_flush()
    assert backlog.read(conn).delayed == 0
