"""A cancel that lands while a worker is delivering the task's job (it popped the id, not yet ran it), on
fakeredis with the in-process worker: the cancel leaves the job to that worker, which can still fetch
it (RQ's spawned work horse fetches it again), runs it as a no-op and finishes it; nothing of RQ's is left
and no traceback is logged. A job still queued is dropped with its hash, as before."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from rq import Queue
from rq.job import Job
from rq.registry import CanceledJobRegistry

from app.core.jobs import JobQueue
from app.core.states import QUEUES
from workers import runner
from workers.worker import StoppableSimpleWorker

API = "/api/v1/tasks"


def test_remove_leaves_a_job_a_worker_already_took_to_that_worker(conn, config, enqueue):
    jobs = JobQueue(conn, config)
    enqueue("taken", "high", 60)
    enqueue("queued", "default", 60)
    popped = Queue.dequeue_any(list(jobs.queues.values()), None, connection=conn)  # a worker's pop
    assert popped is not None and popped[0].id == "taken"
    left = jobs.remove("taken", "queued")
    assert Job.fetch("taken", connection=conn).id == "taken"  # what the worker's work horse still reads
    assert left == ["taken"]
    assert not conn.exists(Job.key_for("queued")) and jobs.queues["default"].count == 0


@pytest.fixture
def client(app, config, conn) -> Any:
    runner.use(runner.Runner(config, conn))
    yield app.test_client()
    runner.use(None)


def test_a_cancel_during_a_delivery_ends_quietly_and_leaves_nothing_of_rqs(client, conn, monkeypatch, caplog):
    r = client.post(API, json={"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1}})
    task_id = r.get_json()["task_id"]
    dequeue = StoppableSimpleWorker.dequeue_job_and_maintain_ttl

    def dequeue_then_cancel(self: StoppableSimpleWorker, *args: Any, **kwargs: Any) -> Any:
        taken = dequeue(self, *args, **kwargs)
        if taken is not None:
            assert client.delete(f"{API}/{task_id}").status_code == 204  # the cancel lands here
            Job.fetch(taken[0].id, connection=conn)  # as RQ's spawned work horse does before it runs the job
        return taken

    monkeypatch.setattr(StoppableSimpleWorker, "dequeue_job_and_maintain_ttl", dequeue_then_cancel)
    with caplog.at_level(logging.INFO):
        StoppableSimpleWorker(list(QUEUES), connection=conn).work(burst=True, logging_level="INFO")

    assert client.get(f"{API}/{task_id}").get_json()["status"] == "CANCELLED"
    assert [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []
    for line in ("cancelled (was PENDING; a worker had just taken its job and will drop it)",  # the web
                 "delivery ignored: task is CANCELLED"):  # the worker
        assert [getattr(r, "task_id", None) for r in caplog.records if r.getMessage() == line] == [task_id], line
    assert list(conn.scan_iter("rq:job:*")) == [] and list(conn.scan_iter("rq:execution*")) == []
    for name in QUEUES:
        queue = Queue(name, connection=conn)
        assert queue.count == 0 and queue.started_job_registry.get_job_ids() == []
        assert queue.failed_job_registry.get_job_ids() == []
        assert CanceledJobRegistry(name, connection=conn).get_job_ids() == []
