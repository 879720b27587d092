"""A job RQ stops on request (a cancel) lands in RQ's canceled registry, not the failed one; queues are
listed from the start; housekeeping trims old canceled entries. (The real stop, with a forked work horse,
is in tests/integration/test_operator_views.py.)"""

from __future__ import annotations

import pytest
from rq import Queue, SimpleWorker
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry
from rq.utils import current_timestamp

from app.core.jobs import CANCELED_JOB_TTL, JobQueue, register_queues
from app.core.states import QUEUES
from workers.worker import cancel_aware


@pytest.fixture
def job(conn, enqueue) -> Job:
    enqueue("stopped-1", "default", 60)
    return Job.fetch("stopped-1", connection=conn)


def worker(conn):
    return cancel_aware(SimpleWorker)([Queue(q, connection=conn) for q in QUEUES], connection=conn)


def test_a_stopped_job_goes_to_the_canceled_registry_with_its_end_time(conn, job):
    w = worker(conn)
    w._stopped_job_id = job.id  # what RQ's stop-job command handler sets before it kills the work horse
    w.handle_job_failure(job, Queue("default", connection=conn), exc_string="Job stopped by user")
    queue = Queue("default", connection=conn)
    assert queue.failed_job_registry.get_job_ids() == []
    assert CanceledJobRegistry("default", connection=conn).get_job_ids() == [job.id]
    fetched = Job.fetch(job.id, connection=conn)
    assert fetched.get_status() == JobStatus.CANCELED and fetched.ended_at is not None
    assert 0 < conn.ttl(job.key) <= CANCELED_JOB_TTL


def test_a_real_failure_stays_in_the_failed_registry(conn, job):
    worker(conn).handle_job_failure(job, Queue("default", connection=conn), exc_string="boom")
    assert Queue("default", connection=conn).failed_job_registry.get_job_ids() == [job.id]
    assert CanceledJobRegistry("default", connection=conn).get_job_ids() == []


def test_the_worker_class_keeps_its_name():
    assert cancel_aware(SimpleWorker).__name__ == "SimpleWorker"


def test_every_queue_is_listed_before_its_first_job(conn):
    assert Queue.all(connection=conn) == []
    register_queues(conn)
    register_queues(conn)
    assert sorted(q.name for q in Queue.all(connection=conn)) == sorted(QUEUES)


def test_housekeeping_trims_canceled_entries_older_than_their_ttl(conn, config, job):
    registry = CanceledJobRegistry("default", connection=conn)
    conn.zadd(registry.key, {job.id: current_timestamp() - CANCELED_JOB_TTL - 10})  # canceled long ago
    registry.add(Job.create("workers.runner.run_task", id="recent", connection=conn))  # canceled just now
    JobQueue(conn, config).trim_finished()
    assert registry.get_job_ids() == ["recent"]
    assert not conn.exists(job.key)
