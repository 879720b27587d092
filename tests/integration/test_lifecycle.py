"""Lifecycle promises proven by killing real processes: a task is never lost and never stuck.

Stall timeout, heartbeat and housekeeping intervals are shortened (FAST) so each test takes seconds.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
import requests

from app.core import keys
from app.core.answers import NewTask
from app.core.housekeeping_passes import PASSES, job_id
from app.core.states import QUEUES
from app.core.store import TaskStore
from tests.integration.harness import Stack, wait_until

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults

FAST: dict[str, Any] = {
    "stall_timeout": 2.0,
    "heartbeat_interval": 0.2,
    "housekeeping_interval": 1,
    "scheduler_interval": 0.1,
    "processors": "tests.userprocs.tasks",
    "retry_backoff": "0",
}


def submit(stack: Stack, type_: str, payload: dict[str, Any]) -> str:
    r = requests.post(stack.url("/api/v1/tasks"), json={"type": type_, "payload": payload}, timeout=5)
    assert r.status_code == 202, r.text
    return str(r.json()["task_id"])


def status(stack: Stack, task_id: str) -> dict[str, Any]:
    r = requests.get(stack.url(f"/api/v1/tasks/{task_id}"), timeout=5)
    assert r.status_code in (200, 410), r.text
    return dict(r.json())


def wait_status(stack: Stack, task_id: str, *wanted: str, timeout: float = 15) -> dict[str, Any]:
    return wait_until(lambda: (doc := status(stack, task_id))["status"] in wanted and doc, timeout=timeout,
                      message=lambda: f"{task_id} to reach {wanted}: {status(stack, task_id)}")


def test_task_of_a_killed_worker_completes_on_another_without_using_an_attempt(stack: Stack) -> None:
    stack.configure(**FAST)
    stack.start_web()
    stack.start_scheduler()
    victim = stack.start_worker(name="victim")
    task_id = submit(stack, "test.nap", {"seconds": 2})
    wait_until(lambda: status(stack, task_id)["progress"] > 0, message="the victim to make progress")
    stack.kill9(victim)
    killed = time.monotonic()
    survivor = stack.start_worker(name="survivor")[0]
    # started_at keeps the first start (docs/api.md): the new run is the survivor's "started" line for the task
    wait_until(lambda: any(f"task_id={task_id} started test.nap" in line for line in survivor.log().splitlines()),
               timeout=10, message="the task to be re-run")
    detected = time.monotonic() - killed
    doc = wait_status(stack, task_id, "COMPLETED")
    assert doc["attempts"] == 1 and doc["progress"] == 100  # the lost run gave its attempt back
    budget = FAST["stall_timeout"] + FAST["housekeeping_interval"] + 1.0
    assert detected < budget, f"recovery took {detected:.2f} s, more than {budget} s"
    print(f"kill -9 detection to re-run: {detected:.2f} s (stall timeout {FAST['stall_timeout']} s)")


def test_task_of_a_killed_worker_past_the_bound_of_lost_runs_fails_minus_3(stack: Stack) -> None:
    stack.configure(**FAST, lost_runs=0)  # no lost run without progress runs again: the first one is a poison item
    stack.start_web()
    stack.start_scheduler()
    victim = stack.start_worker(name="victim")
    task_id = submit(stack, "demo.sleep", {"seconds": 30, "steps": 300})
    wait_status(stack, task_id, "PROCESSING")
    stack.kill9(victim)
    doc = wait_status(stack, task_id, "FAILED", timeout=FAST["stall_timeout"] + 5)
    assert doc["error"]["code"] == -3 and doc["attempts"] == 1


@pytest.mark.parametrize("fsync", ["always", "everysec"])
def test_redis_kill_9_during_a_submit_burst_loses_at_most_the_fsync_window(
    redis_factory: Any, tmp_path: Any, fsync: str
) -> None:
    server = redis_factory(fsync=fsync)
    stack = Stack(server.url, tmp_path / "stack", **FAST)
    try:
        stack.start_web()
        acked, killed_at = _burst_then_kill(stack, server)
        server.start()  # same data dir: replays the append-only file
        stack.start_worker()
        conn = server.client()
        present = [t for t in acked if conn.exists(keys.task(t))]
        lost = [t for t, at in acked.items() if t not in present]
        assert len(acked) > 50, "the burst should have been acknowledged many times"
        if fsync == "always":
            assert lost == []
        else:
            assert all(acked[t] > killed_at - 2.0 for t in lost), "lost a submit older than the fsync window"
        for task_id in present:
            assert wait_status(stack, task_id, "COMPLETED")["attempts"] == 1
        listed = conn.zrange(keys.history("public"), 0, -1)
        assert len(listed) == len(set(listed)) and set(present) <= {t.decode() for t in listed}
        print(f"fsync={fsync}: {len(acked)} acknowledged, {len(lost)} lost")
    finally:
        stack.teardown()


def _burst_then_kill(stack: Stack, server: Any) -> tuple[dict[str, float], float]:
    """Four threads submit until the kill; returns {task id: time of its 202} and the kill time."""
    acked: dict[str, float] = {}
    stop = threading.Event()

    def submitter() -> None:
        with requests.Session() as session:
            while not stop.is_set():
                payload = {"seconds": 0, "steps": 1, "items": 0, "fail_items": [uuid.uuid4().int % 10**6]}
                try:
                    r = session.post(stack.url("/api/v1/tasks"), json={"type": "demo.sleep", "payload": payload},
                                     timeout=5)
                except requests.RequestException:
                    continue
                if r.status_code == 202:
                    acked[r.json()["task_id"]] = time.monotonic()

    threads = [threading.Thread(target=submitter) for _ in range(4)]
    for t in threads:
        t.start()
    wait_until(lambda: len(acked) >= 100, timeout=20, message="a hundred acknowledged submits")
    killed_at = time.monotonic()
    server.kill9()
    wait_until(lambda: requests.get(stack.url("/readyz"), timeout=5).status_code == 503, message="web to see it")
    stop.set()
    for t in threads:
        t.join()
    return {t: at for t, at in acked.items() if at <= killed_at}, killed_at


def test_schedulers_restarted_and_doubled_run_each_pass_once_per_interval(stack: Stack, redis_conn: Any) -> None:
    stack.configure(**FAST)
    first = stack.start_scheduler()
    stack.stop(first)
    stack.stop(stack.start_scheduler())
    stack.start_scheduler()
    stack.start_scheduler()  # two at once from here on
    fixed = {job_id(name).encode() for name in PASSES}
    # rq-scheduler moves a due job out of its set and back in (two commands): await a settled read
    wait_until(lambda: set(redis_conn.zrange("rq:scheduler:scheduled_jobs", 0, -1)) == fixed,
               message="exactly the three fixed housekeeping schedules")

    def runs() -> dict[str, int]:
        stats = {k.decode(): int(v) for k, v in redis_conn.hgetall(keys.STATS).items()}
        return {p: stats.get(f"housekeeping_{p}", 0) for p in ("expire", "recover", "monitor")}

    wait_until(lambda: min(runs().values()) >= 1, message="every pass to run once")
    start, began = runs(), time.monotonic()
    wait_until(lambda: min(runs().values()) >= min(start.values()) + 4, timeout=15, message="four more intervals")
    elapsed = time.monotonic() - began
    most = int(elapsed / FAST["housekeeping_interval"]) + 1
    for name, count in runs().items():
        assert count - start[name] <= most, f"{name} ran {count - start[name]} times in {elapsed:.1f} s"


def test_expiry_tombstones_a_result_and_its_file_then_forgets_it(stack: Stack) -> None:
    stack.configure(**FAST, result_ttl=1, tombstone_ttl=4)  # the hash outlives a housekeeper late under load
    stack.start_web()
    stack.start_worker()
    stack.start_scheduler()
    task_id = submit(stack, "orders.export", {"rows": 10})
    wait_status(stack, task_id, "COMPLETED")
    folder = stack.config.results_dir / task_id
    assert any(folder.iterdir())
    conn = stack.redis()
    wait_until(lambda: conn.hget(keys.task(task_id), "status") == b"EXPIRED", message="the tombstone")
    r = requests.get(stack.url(f"/api/v1/tasks/{task_id}/result"), timeout=5)
    assert r.status_code == 410 and r.json()["status"] == "EXPIRED"
    assert not conn.exists(keys.result(task_id))  # dropped by the tombstone's own script
    # the file goes after the tombstone is written (workers.housekeeping, _after_expiry): await it
    wait_until(lambda: not folder.exists(), message=lambda: f"{folder} removed after the tombstone")
    wait_until(lambda: requests.get(stack.url(f"/api/v1/tasks/{task_id}"), timeout=5).status_code == 404,
               message="the tombstone to go")


def test_unfinished_task_past_its_ttl_expires_with_minus_4_and_leaves_the_queue(stack: Stack) -> None:
    stack.configure(**FAST, task_ttl=1)
    stack.start_web()
    stack.start_scheduler()  # no worker: the task stays queued
    task_id = submit(stack, "demo.sleep", {"seconds": 0})
    conn = stack.redis()
    wait_until(lambda: conn.hget(keys.task(task_id), "status") == b"EXPIRED", message="expiry")
    doc = status(stack, task_id)
    assert doc["status"] == "EXPIRED" and doc["error"]["code"] == -4
    assert conn.llen("rq:queue:default") == 0 and not conn.exists(f"rq:job:{task_id}")


def test_expiry_pass_touches_only_the_expired_among_100k_live(redis_conn: Any, tmp_path: Any) -> None:
    from app.core.config import Config
    from workers.housekeeping import Housekeeper, PassReport

    config = Config.from_env({}, redis_url="redis://unused", data_dir=tmp_path)
    store = TaskStore(redis_conn, config)
    future = int(time.time() * 1000) + 86_400_000
    pipe = redis_conn.pipeline(transaction=False)
    for i in range(100_000):
        pipe.zadd(keys.EXPIRY, {f"live-{i}": future + i})
        if i % 10_000 == 9_999:
            pipe.execute()
    expired = []
    for _ in range(1000):
        new = NewTask(task_id=str(uuid.uuid4()), member="public", type="demo.sleep", payload={},
                      dedup_digest=uuid.uuid4().hex, priority="default", max_attempts=1)
        store.create(new)
        store.start(new.task_id, "run")
        store.complete(new.task_id, "run", {}, items=None, failures=[], error_code=None)
        pipe.zadd(keys.EXPIRY, {new.task_id: 1})
        expired.append(new.task_id)
    pipe.execute()
    before = _calls(redis_conn)
    report = PassReport("expire")
    began = time.perf_counter()
    Housekeeper(redis_conn, config).expire(report)
    took = time.perf_counter() - began
    delta = {k: v - before.get(k, 0) for k, v in _calls(redis_conn).items() if v != before.get(k, 0)}
    assert report.counts["due"] == 1000 and report.counts["expired_completed"] == 1000
    assert delta.get("eval", 0) == 1000  # one script per due task
    # per due task: one read (status, job) and the script's own, which holds the audit entry's fields too
    assert delta.get("hmget", 0) == 2000
    # two full batches of 500 and one empty read, plus one read per queue of RQ's canceled registry
    # (old canceled jobs, app.core.jobs.JobQueue.trim_finished): a constant, whatever the number of tasks
    assert delta.get("zrangebyscore", 0) == 3 + len(QUEUES)
    assert all(store.get(t).status == "EXPIRED" for t in expired[:10])
    assert redis_conn.zcard(keys.EXPIRY) == 100_000 + 1000  # tombstones stay indexed until they end
    print(f"expiry pass over 1000 due among 100k live: {took:.3f} s")


def _calls(conn: Any) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): v["calls"] for k, v in conn.info("commandstats").items()}
