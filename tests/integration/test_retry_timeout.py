"""Retries and timeouts with a real RQ worker: an unexpected exception is retried with backoff while
attempts remain, then fails with -1 (traceback in the worker's log only); a job past its timeout fails
with -2. Uses the test processors of tests/userprocs (``test.flaky`` retries twice, ``test.slow`` has
a one-second timeout). A retry's backoff waits in taskport's delayed set, queued by a scheduler's promote
tick: on time whichever worker holds RQ's scheduler lock (issue 29, finding 7)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from rq import Queue
from rq.scheduler import RQScheduler

from app.core.states import QUEUES
from tests.integration.harness import TASKS, Api, Stack, wait_until

USER_PROCESSORS = "tests.userprocs.tasks"


@pytest.fixture
def stack_settings() -> dict[str, Any]:
    return {"processors": USER_PROCESSORS}


def calls(marker: Path) -> int:
    return marker.read_bytes().count(b"\n") if marker.exists() else 0


def test_a_failure_is_retried_after_its_backoff_then_succeeds(stack: Stack, api: Api, tmp_path: Path) -> None:
    stack.configure(retry_backoff="1")  # a real delay: the retry waits in the delayed set for the promote tick
    stack.start_scheduler()
    stack.start_worker()
    marker = tmp_path / "flaky-once"
    submitted = time.monotonic()
    task_id = api.create("test.flaky", {"marker": str(marker), "fail_times": 1})
    done = api.wait_for(task_id, "COMPLETED")
    took = time.monotonic() - submitted
    assert done["attempts"] == 2 and done["error"] is None and done["progress"] == 100
    assert calls(marker) == 2
    assert took >= 1, f"retried after {took:.2f} s, before its one-second backoff"
    result = api.get(f"{TASKS}/{task_id}/result").json()
    assert result["result"] == {"calls": 2}


def test_a_retry_runs_on_time_while_rq_s_scheduler_lock_is_held_by_a_dead_worker(stack: Stack, api: Api,
                                                                                 tmp_path: Path) -> None:
    # a retry used to wait in RQ's scheduled-job registry, which only the worker holding rq:scheduler-lock:<queue>
    # moves: with the holder killed -9 (its lock's TTL still running), the others looked again only at their
    # maintenance, 600 s later (810.6 s measured). Here every queue's lock is held by such a dead worker. A 3 s
    # backoff: the retry's PENDING moment, which the test must see, lasts 3 s, not one a stalled poll could miss
    stack.configure(retry_backoff="3")
    conn = stack.redis()
    for queue in QUEUES:
        conn.set(RQScheduler.get_locking_key(queue), "a worker killed -9", ex=600)
    stack.start_scheduler()
    stack.start_worker()
    marker = tmp_path / "flaky-once"
    task_id = api.create("test.flaky", {"marker": str(marker), "fail_times": 1})
    waiting = wait_until(lambda: (doc := api.status(task_id))["status"] == "PENDING" and doc["attempts"] == 1 and doc,
                         timeout=30, interval=0.01, message="the task to wait for its retry")
    failed_at = time.monotonic()
    assert waiting["message"] == "attempt 1 failed; retrying in 3s" and waiting["run_at"] is not None, waiting
    assert Queue("default", connection=conn).scheduled_job_registry.count == 0  # nothing of it waits in RQ
    done = api.wait_for(task_id, "COMPLETED")
    took = time.monotonic() - failed_at
    assert done["attempts"] == 2 and calls(marker) == 2
    assert took < 7, f"retried {took:.2f} s after the failure, for a three-second backoff"
    assert all(Queue(q, connection=conn).scheduled_job_registry.count == 0 for q in QUEUES)  # rq-dashboard: none
    conn.close()


def test_retries_exhausted_fail_with_minus_one_and_the_traceback_stays_in_the_log(
    stack: Stack, api: Api, tmp_path: Path
) -> None:
    stack.configure(retry_backoff="0")
    [worker] = stack.start_worker()
    marker = tmp_path / "flaky-always"
    task_id = api.create("test.flaky", {"marker": str(marker), "fail_times": 5})
    failed = api.wait_for(task_id, "FAILED")
    assert failed["error"] == {"code": -1, "message": "processing error, please retry later"}
    assert failed["attempts"] == 3 and calls(marker) == 3

    log = worker.log()
    assert "Traceback (most recent call last)" in log and "RuntimeError: flaky failure on call 3" in log
    assert f"task_id={task_id} processor raised (attempt 3 of 3)" in log
    bodies = [api.get(f"{TASKS}/{task_id}").text, api.get(f"{TASKS}/{task_id}/result").text,
              api.get(TASKS, params={"status": "FAILED"}).text]
    for body in bodies:
        assert "flaky failure" not in body and "Traceback" not in body and "RuntimeError" not in body, body
    result = api.get(f"{TASKS}/{task_id}/result")
    assert result.status_code == 409 and result.json()["error"]["code"] == -1


@pytest.mark.serial  # a duration under CPU contention: run alone (tests/README.md, "Speed")
def test_a_job_past_its_timeout_fails_with_minus_two(stack: Stack, api: Api) -> None:
    stack.start_worker()
    submitted = time.monotonic()
    task_id = api.create("test.slow", {"seconds": 5})
    failed = api.wait_for(task_id, "FAILED", timeout=4.5)
    took = time.monotonic() - submitted
    assert failed["error"] == {"code": -2, "message": "task timed out"}
    assert failed["attempts"] == 1
    assert took < 3, f"the one-second timeout took {took:.2f} s to fail the task"
    after = api.create("user.echo", {"text": "the worker goes on"})  # the worker survived the timeout
    assert api.wait_for(after, "COMPLETED")["status"] == "COMPLETED"
