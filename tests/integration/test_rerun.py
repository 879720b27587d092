"""Run again with a real RQ worker: a task that FAILED (its retries used up) is retried over HTTP and
completes under the same id, its attempts counting on; a second retry of the COMPLETED task is 409.
(``test.flaky`` of tests/userprocs fails its first ``fail_times`` calls, and retries twice.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.integration.harness import TASKS, Api, Stack


@pytest.fixture
def stack_settings() -> dict[str, Any]:
    return {"processors": "tests.userprocs.tasks"}


def test_a_failed_task_retried_over_http_completes_under_the_same_id(stack: Stack, api: Api, tmp_path: Path) -> None:
    stack.configure(retry_backoff="0")
    stack.start_worker()
    marker = tmp_path / "flaky"
    task_id = api.create("test.flaky", {"marker": str(marker), "fail_times": 3})
    failed = api.wait_for(task_id, "FAILED")
    assert failed["attempts"] == 3 and failed["error"]["code"] == -1
    r = api.post(f"{TASKS}/{task_id}/retry")
    assert r.status_code == 202, r.text
    assert r.json()["task_id"] == task_id and r.json()["status"] in ("PENDING", "PROCESSING")
    done = api.wait_for(task_id, "COMPLETED")
    assert (done["attempts"], done["error"], done["progress"]) == (4, None, 100)
    assert api.get(f"{TASKS}/{task_id}/result").json()["result"] == {"calls": 4}
    assert api.post(f"{TASKS}/{task_id}/retry").status_code == 409
