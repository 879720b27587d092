"""What operators see of a taskport job in RQ: the registry of its task's end (:class:`RecordsOutcome`), and a
job stopped on request filed as canceled, not failed (:class:`CancelAware`).

Its own module because it is the one place that writes RQ's registries for a job's end, apart from how a
worker takes its jobs (workers.dequeue) and how long its registration lives (workers.lease); the worker
classes that mix it in are in workers.worker.
"""

from __future__ import annotations

from typing import Any

from rq import Queue
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry
from rq.utils import now, utcformat

from app.core.jobs import CANCELED_JOB_TTL, FINISHED_JOB_TTL
from app.core.states import TaskStatus


def record_stopped_as_canceled(job: Job) -> None:
    """Move a job RQ stopped on request (a task cancelled, or expired, while running) from the failed
    registry, where RQ puts it with status STOPPED, to the canceled registry, with its end time."""
    conn = job.connection
    job.ended_at = now()
    pipe = conn.pipeline()
    job.failed_job_registry.remove(job, pipeline=pipe)
    job.set_status(JobStatus.CANCELED, pipeline=pipe)
    job.save(pipeline=pipe, include_meta=False)
    CanceledJobRegistry(job.origin, connection=conn).add(job, pipeline=pipe)
    pipe.expire(job.key, CANCELED_JOB_TTL)
    pipe.execute()


class CancelAware:
    """Mixin for an RQ worker class: a job stopped on request ends in the canceled registry, not the failed one.

    RQ 3.0 treats ``send_stop_job_command`` as a failure ("Job stopped by user, work-horse terminated"):
    operators would count every cancel as a failed job. Its status is STOPPED after RQ's own handling.
    """

    def handle_job_failure(self, job: Job, queue: Queue, *args: Any, **kwargs: Any) -> None:
        super().handle_job_failure(job, queue, *args, **kwargs)  # type: ignore[misc]
        if job.get_status(refresh=False) == JobStatus.STOPPED:
            record_stopped_as_canceled(job)


class RecordsOutcome:
    """Mixin for an RQ worker class: a taskport job ends in the RQ registry of its task's end, so rq-dashboard and
    ``rq info`` show what failed, why, and how much finished.

    ``run_task`` returns a :class:`workers.endings.RunEnd` when its delivery ended the task. FAILED: RQ's own
    failure path, with the task's code and message as the failure's text (never a traceback: nothing was
    raised), so the job sits in the failed registry for ``FAILED_JOB_TTL`` (rq-dashboard's Requeue runs the
    task again: app.web.requeue). COMPLETED: the job stays, in the finished registry, for ``FINISHED_JOB_TTL``
    (one MULTI; no result record: the task hash holds the result). Any other return (None, a ``Retry``) takes
    RQ's path as before: a delivery that changed nothing is deleted at once (``RESULT_TTL`` 0).
    """

    def _finalize_success(self, job: Job, queue: Queue, execution: Execution, return_value: Any) -> None:
        from workers.endings import RunEnd  # late, as the runner itself (workers.worker.main)

        if not isinstance(return_value, RunEnd):
            super()._finalize_success(job, queue, execution, return_value)  # type: ignore[misc]
            return
        worker: Any = self
        job.ended_at = now()
        if getattr(worker, "_stopped_job_id", None) == job.id:
            worker._stopped_job_id = None  # the stop came as the run ended the task: its end stands
        if return_value.status == TaskStatus.FAILED:
            job._status = JobStatus.FAILED
            worker.handle_job_failure(job, queue, started_job_registry=queue.started_job_registry,
                                      exc_string=return_value.describe(), execution=execution)
            worker.log.info("Worker %s: %s: Job failed (%s): %s", worker.name, job.origin, job.id,
                            return_value.describe())
            return
        job._status = JobStatus.FINISHED
        self._finish_completed(job, queue, execution)
        worker.log.info("Worker %s: %s: Job OK (%s)", worker.name, job.origin, job.id)

    def _finish_completed(self, job: Job, queue: Queue, execution: Execution) -> None:
        """What RQ's success path writes for a kept job, minus the result record, in one MULTI."""
        worker: Any = self
        assert job.started_at is not None and job.ended_at is not None
        with worker.connection.pipeline() as pipe:
            worker.increment_successful_job_count(pipeline=pipe)
            worker.increment_total_working_time(job.ended_at - job.started_at, pipe)
            worker.cleanup_execution(job, pipeline=pipe, execution=execution)
            pipe.hset(job.key, mapping={"status": JobStatus.FINISHED, "ended_at": utcformat(job.ended_at)})
            pipe.expire(job.key, FINISHED_JOB_TTL)
            queue.finished_job_registry.add(job, FINISHED_JOB_TTL, pipeline=pipe)
            pipe.execute()

