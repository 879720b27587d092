"""Tasks that wait, with real processes (issue 20): a web, a worker and a scheduler, whose timers queue a task
when its ``run_at`` comes (workers.deferred) and release or fail the tasks that run after one that ended."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime

import pytest

from app.core import keys
from tests.integration.harness import Api, Stack, started_stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("deferred")) as s:
        s.start_scheduler()
        yield s


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Api]:
    with Api(stack.base_url) as client:
        yield client


def seconds(doc: dict, start: str, end: str) -> float:
    parse = datetime.fromisoformat
    return (parse(doc[end]) - parse(doc[start])).total_seconds()


@pytest.mark.serial  # a duration under CPU contention: run alone (tests/README.md, "Speed")
def test_a_delay_of_3_s_starts_between_3_and_4_s_after_the_submit(api: Api) -> None:
    task_id = api.create("demo.sleep", {"steps": 1}, delay=3, dedup_key=uuid.uuid4().hex)
    assert api.status(task_id)["run_at"] is not None
    done = api.wait_for(task_id, "COMPLETED")
    assert 3.0 <= seconds(done, "created_at", "started_at") < 4.0, done


def test_a_task_cancelled_before_its_time_never_runs(api: Api, stack: Stack) -> None:
    task_id = api.create("demo.sleep", {"steps": 1}, delay=1, dedup_key=uuid.uuid4().hex)
    assert api.delete(f"/api/v1/tasks/{task_id}").status_code == 204
    time.sleep(2)  # past its run_at, and a few ticks of the scheduler
    doc = api.status(task_id)
    assert doc["status"] == "CANCELLED" and doc["started_at"] is None and doc["attempts"] == 0
    assert stack.redis().zcard(keys.DELAYED) == 0


@pytest.mark.serial  # a duration under CPU contention: run alone (tests/README.md, "Speed")
def test_a_chain_of_three_with_a_failing_middle_fails_the_last_at_once(api: Api) -> None:
    # first runs 2 s, so the reads below of a chain still waiting never race its end (three requests on a
    # loaded box can take longer than a 0.3 s run)
    first = api.create("demo.sleep", {"seconds": 2, "steps": 1}, dedup_key=uuid.uuid4().hex)
    middle = api.create("demo.sleep", {"steps": 1, "fail_code": 10001}, after=[first], dedup_key=uuid.uuid4().hex)
    last = api.create("demo.sleep", {"steps": 1}, after=[middle], dedup_key=uuid.uuid4().hex)
    assert api.status(last)["waiting_for"] == [middle]
    failed = api.wait_for(middle, "FAILED")
    assert failed["error"]["code"] == 10001 and api.status(first)["status"] == "COMPLETED"
    doc = api.wait_for(last, "FAILED")  # "at once": the completion times below say it
    assert doc["error"]["code"] == -6 and doc["error"]["message"].endswith(f"{middle} is FAILED")
    assert doc["started_at"] is None
    assert seconds({"a": failed["completed_at"], "b": doc["completed_at"]}, "a", "b") < 1.5  # a tick or two
