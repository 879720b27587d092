"""Cancel racing delivery, with real processes: tasks are cancelled while workers are taking them off the
queue (submit, then cancel at once, many times), so some cancels land after a worker popped the job and
before it ran it. Whichever side wins, the task ends CANCELLED (or COMPLETED, if the run was first), no
process logs a traceback, nothing of RQ's is left behind for good (a COMPLETED task's job stays in the finished
registry for its window, a stopped one in the canceled registry), and the workers go on serving."""

from __future__ import annotations

import uuid

import pytest
import redis
from rq import Queue
from rq.registry import CanceledJobRegistry

from app.core.states import QUEUES
from tests.integration.harness import TASKS, Api, Stack, wait_until

ROUNDS = 60  # submit + cancel pairs per worker class: several cancels land inside a delivery (see the log)


def canceled_jobs(conn: redis.Redis) -> set[str]:
    """Jobs RQ stopped on request (a cancel that found the task PROCESSING): kept for CANCELED_JOB_TTL."""
    return {i for name in QUEUES for i in CanceledJobRegistry(name, connection=conn).get_job_ids()}


def finished_jobs(conn: redis.Redis) -> set[str]:
    """Jobs whose run COMPLETED their task: kept in the finished registry for FINISHED_JOB_TTL."""
    return {i for name in QUEUES for i in Queue(name, connection=conn).finished_job_registry.get_job_ids()}


@pytest.mark.parametrize("worker_class", ["simple", "fork", "spawn"])
def test_cancels_racing_deliveries_log_no_traceback_and_leave_nothing_behind(
    stack: Stack, api: Api, worker_class: str
) -> None:
    stack.configure(worker_class=worker_class)
    stack.start_worker(n=2)
    answers: dict[str, int] = {}
    for _ in range(ROUNDS):
        task_id = api.create("demo.sleep", {"seconds": 0, "steps": 1}, dedup_key=uuid.uuid4().hex)
        answers[task_id] = api.delete(f"{TASKS}/{task_id}").status_code
    last = api.create("demo.sleep", {"seconds": 0, "steps": 1}, dedup_key=uuid.uuid4().hex)
    api.wait_for(last, "COMPLETED", timeout=20)  # the workers still serve after the races

    assert set(answers.values()) <= {204, 409}
    for task_id, answer in answers.items():  # 409: the run completed before the cancel came
        api.wait_for(task_id, "CANCELLED" if answer == 204 else "COMPLETED", timeout=10)
    conn = stack.redis()
    try:
        def settled() -> bool:  # every delivery is over: only stopped and completed jobs keep their hash, a while
            kept = canceled_jobs(conn) | finished_jobs(conn)
            return not any(conn.exists(f"rq:job:{i}") for i in [*answers, last] if i not in kept)

        wait_until(settled, timeout=10, message="RQ's job hashes of no-op deliveries to go")
        completed = {task_id for task_id, answer in answers.items() if answer == 409} | {last}
        assert completed <= finished_jobs(conn) and not finished_jobs(conn) & canceled_jobs(conn)
        for job_id in canceled_jobs(conn) | finished_jobs(conn):
            assert conn.ttl(f"rq:job:{job_id}") > 0, f"job {job_id} kept for good"
        for name in QUEUES:
            queue = Queue(name, connection=conn)
            assert queue.count == 0 and queue.scheduled_job_registry.count == 0
            assert queue.started_job_registry.get_job_ids() == []
            assert queue.failed_job_registry.get_job_ids() == []
    finally:
        conn.close()
    for proc in stack.procs:
        for marker in ("Traceback", "InvalidJobOperation", "NoSuchJobError"):
            assert marker not in proc.log(), f"{marker} in {proc.name}'s log:\n{proc.tail(60)}"
