"""JobQueue: the RQ side of a task."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from rq.job import Job

from app.core.jobs import JobQueue


def test_remove_drops_queued_and_retry_scheduled_jobs_in_one_go(conn, config, enqueue):
    jobs = JobQueue(conn, config)
    enqueue("queued-1", "default", 60)
    enqueue("queued-2", "high", 60)
    scheduled = jobs.queues["low"].create_job("workers.runner.run_task", args=("later",), job_id="later")
    jobs.queues["low"].schedule_job(scheduled, datetime.now(UTC) + timedelta(minutes=5))
    jobs.remove("queued-1", "queued-2", "later", "never-existed")
    assert all(q.count == 0 for q in jobs.queues.values())
    assert jobs.queues["low"].scheduled_job_registry.count == 0
    assert not any(conn.exists(Job.key_for(i)) for i in ("queued-1", "queued-2", "later"))


def test_remove_of_nothing_is_a_no_op(conn, config):
    JobQueue(conn, config).remove()
