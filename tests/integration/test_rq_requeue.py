"""RQ's own tools on taskport's jobs, with real processes (a web, real workers, a real redis-server, RQ's own ``rq``
command): ``rq requeue <id>`` and ``rq requeue --all`` run the failed tasks again, as rq-dashboard's Requeue does;
a requeue that cannot run its task again keeps the job in the failed list with why; and a task run again (by
the API's retry or a requeue) keeps one failed entry, its newest."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from rq import Queue

from app.core import keys
from tests.integration.harness import Api, Stack, wait_until

RQ = str(Path(sys.executable).parent / "rq")
FAILING = {"seconds": 0, "steps": 1, "fail_code": 10001}


def rq(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([RQ, *args, "--url", str(stack.config.redis_url)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def failed_ids(stack: Stack) -> list[str]:
    return sorted(Queue("default", connection=stack.redis()).failed_job_registry.get_job_ids())


def fail(api: Api) -> str:
    task_id = api.create("demo.sleep", FAILING, dedup_key=uuid.uuid4().hex)
    api.wait_for(task_id, "FAILED")
    return task_id


def failed_again(api: Api, task_id: str, attempts: int) -> dict[str, Any]:
    return wait_until(lambda: (d := api.status(task_id))["status"] == "FAILED" and d["attempts"] == attempts and d,
                      message=f"task {task_id} to run again and fail again")


@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_rq_requeue_of_one_job_and_of_all_runs_the_tasks_again_with_one_failed_entry_each(stack: Stack, api: Api,
                                                                                         worker_class: str) -> None:
    stack.configure(worker_class=worker_class)
    [worker] = stack.start_worker()
    first, second = fail(api), fail(api)
    wait_until(lambda: failed_ids(stack) == sorted([first, second]), message="both jobs in the failed registry")

    out = rq(stack, "requeue", "--queue", "default", first).stdout
    assert "Requeueing 1 jobs" in out, out
    failed_again(api, first, 2)
    wait_until(lambda: [i.split("_")[0] for i in failed_ids(stack)] == sorted([first, second]),
               message="one failed entry per task, the second run's own")
    assert first not in failed_ids(stack)
    assert "run again from RQ's requeue of job" in worker.log()

    rq(stack, "requeue", "--queue", "default", "--all")
    failed_again(api, first, 3)
    failed_again(api, second, 2)
    entries = wait_until(lambda: len(ids := failed_ids(stack)) == 2 and first not in ids and second not in ids and ids,
                         message="the newest failed entry of each task")
    assert sorted(i.split("_")[0] for i in entries) == sorted([first, second])
    assert "delivery ignored" not in worker.log()


def test_a_requeue_that_cannot_run_its_task_again_keeps_the_job_in_the_failed_list_with_why(stack: Stack,
                                                                                           api: Api) -> None:
    stack.start_worker()
    failed = fail(api)
    wait_until(lambda: failed_ids(stack) == [failed], message="the failed job")
    stack.redis().delete(keys.payload(failed))  # as a task that ended before failed tasks kept their payloads

    rq(stack, "requeue", "--queue", "default", failed)
    queue = Queue("default", connection=stack.redis())

    def refusal() -> str | None:
        job = queue.fetch_job(failed) if failed_ids(stack) == [failed] else None
        text = job.latest_result().exc_string if job else ""
        return text if text.startswith("requeue refused") else None

    why = wait_until(refusal, message="the job filed back in the failed registry, saying why")
    assert why == "requeue refused: the task's payload is no longer kept: submit it again", why
    assert (api.status(failed)["status"], api.status(failed)["attempts"]) == ("FAILED", 1)


def test_a_run_again_by_the_api_leaves_one_failed_entry_for_the_task(stack: Stack, api: Api) -> None:
    stack.start_worker()
    task_id = fail(api)
    wait_until(lambda: failed_ids(stack) == [task_id], message="the failed job")
    r = api.post(f"/api/v1/tasks/{task_id}/retry")
    assert r.status_code == 202, r.text
    failed_again(api, task_id, 2)
    [entry] = wait_until(lambda: (ids := failed_ids(stack)) and task_id not in ids and ids,
                         message="the second run's failed entry in place of the first")
    assert entry.startswith(f"{task_id}_a")
