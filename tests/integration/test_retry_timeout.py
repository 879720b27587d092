"""Retries and timeouts with a real RQ worker: an unexpected exception is retried with backoff while
attempts remain, then fails with -1 (traceback in the worker's log only); a job past its timeout fails
with -2. Uses the test processors of tests/userprocs (``test.flaky`` retries twice, ``test.slow`` has
a one-second timeout)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import TASKS, Api, Stack

USER_PROCESSORS = "tests.userprocs.tasks"


@pytest.fixture
def stack_settings() -> dict[str, Any]:
    return {"processors": USER_PROCESSORS}


def calls(marker: Path) -> int:
    return marker.read_bytes().count(b"\n") if marker.exists() else 0


def test_a_failure_is_retried_after_its_backoff_then_succeeds(stack: Stack, api: Api, tmp_path: Path) -> None:
    stack.configure(retry_backoff="1")  # a real delay: the retry goes through RQ's scheduled-job registry
    stack.start_worker()
    marker = tmp_path / "flaky-once"
    submitted = time.monotonic()
    task_id = api.create("test.flaky", {"marker": str(marker), "fail_times": 1})
    done = api.wait_for(task_id, "COMPLETED", timeout=10)
    took = time.monotonic() - submitted
    assert done["attempts"] == 2 and done["error"] is None and done["progress"] == 100
    assert calls(marker) == 2
    assert took >= 1, f"retried after {took:.2f} s, before its one-second backoff"
    result = api.get(f"{TASKS}/{task_id}/result").json()
    assert result["result"] == {"calls": 2}


def test_retries_exhausted_fail_with_minus_one_and_the_traceback_stays_in_the_log(
    stack: Stack, api: Api, tmp_path: Path
) -> None:
    stack.configure(retry_backoff="0")
    [worker] = stack.start_worker()
    marker = tmp_path / "flaky-always"
    task_id = api.create("test.flaky", {"marker": str(marker), "fail_times": 5})
    failed = api.wait_for(task_id, "FAILED", timeout=10)
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
