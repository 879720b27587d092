"""How a taskport worker takes its jobs (:class:`HonoursPauses`): through a claim (app.core.jobclaims) in place
of RQ's BLPOP, skipping the paused queues, and waiting for work on the wake list.

Its own module because the take is the worker's one delicate loop: a job must never vanish between the queue
and RQ's started registry, and the wait for work is the one step where a stop may raise into the loop
(workers.stopping.GracefulStop reads ``_waiting``, which :meth:`HonoursPauses._wait_for_work` sets). The worker
classes that mix it in are in workers.worker.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import redis
from rq import Queue
from rq.exceptions import StopRequested
from rq.executions import Execution
from rq.job import Job
from rq.worker import WorkerStatus

from app.core import keys
from app.core.jobclaims import WAKE_WAIT, Claims

log = logging.getLogger("workers.worker")  # the worker's log lines keep the logger name they always had


class HonoursPauses:
    """Mixin for an RQ worker class: it takes its jobs through a claim (app.core.jobclaims), never with RQ's
    BLPOP, so a job whose answer is lost stays in the worker's claim list instead of vanishing; and it takes
    no job from a paused queue (running ones finish) while it keeps serving its other queues.

    The claim script walks the worker's queues in priority order and skips the paused ones inside Redis, so
    a pause is honoured from the take that follows it, with nothing read per delivery. An idle worker blocks
    on ``keys.JOB_WAKE`` (a list that holds no job) for at most ``WAKE_WAIT`` s, then looks again: a queue
    resumed, or a job RQ queued itself, is seen within that time. The claim moves to RQ's started registry in
    the pipeline that records the job's execution (:meth:`_unclaim`). Everything else RQ's dequeue does
    (heartbeat, maintenance, log lines, the worker's state) is kept.
    """

    _claims: Claims | None = None
    IDLE_WHEN_TAKEN_NOTHING = False  # True: the worker's state goes IDLE only once a take finds nothing

    def validate_queues(self) -> None:
        """Any RQ Queue will do, as for RQ's own worker (callers hand in plain ones): only the taking changes."""
        worker: Any = self
        for queue in worker.queues:
            if not isinstance(queue, Queue):
                raise TypeError(f"{queue} is not an RQ Queue or a queue name")

    @property
    def claims(self) -> Claims:
        if self._claims is None:
            worker: Any = self
            self._claims = Claims(worker.connection)
        return self._claims

    def dequeue_job_and_maintain_ttl(self, timeout: int | None,
                                     max_idle_time: int | None = None) -> tuple[Job, Queue] | None:
        """RQ's dequeue loop (rq 3.0 ``BaseWorker.dequeue_job_and_maintain_ttl``) with the claim in place of
        ``Queue.dequeue_any``: (the job, its queue), or None once ``max_idle_time`` passed idle (or at once with
        no job, for a burst worker: ``timeout`` None)."""
        worker: Any = self
        idle_late = self.IDLE_WHEN_TAKEN_NOTHING
        if not idle_late:
            worker.set_state(WorkerStatus.IDLE)
        worker.procline("Listening on " + ",".join(worker.queue_names()))
        idle_since = time.monotonic()
        beat_at = -math.inf
        wait_on_error = 1.0
        result = None
        while True:
            try:
                if time.monotonic() - beat_at >= worker.dequeue_timeout:  # as often as RQ's BLPOP timeout
                    worker.heartbeat()
                    beat_at = time.monotonic()
                if worker.should_run_maintenance_tasks:
                    worker.run_maintenance_tasks()
                if worker._stop_requested:  # asked to stop between two steps of this loop: take nothing more
                    raise StopRequested()
                result = self._take()
                if result is None and idle_late:
                    worker.set_state(WorkerStatus.IDLE)  # nothing to do: idle (once: set_state skips a repeat)
                if result is not None or timeout is None:
                    break
                left = None if max_idle_time is None else max_idle_time - (time.monotonic() - idle_since)
                if left is not None and left <= 0:
                    break
                self._wait_for_work(WAKE_WAIT if left is None else max(0.01, min(WAKE_WAIT, left)))
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                log.error("Worker %s: could not connect to Redis instance: %s retrying in %d seconds...",
                          worker.name, exc, wait_on_error)
                time.sleep(wait_on_error)
                wait_on_error = min(wait_on_error * worker.exponential_backoff_factor, worker.max_connection_wait_time)
        worker.heartbeat()
        return result

    def _wait_for_work(self, timeout: float) -> None:
        """Block on the wake list; the one step where a stop raises StopRequested into the loop (GracefulStop)."""
        worker: Any = self
        worker._waiting = True
        try:
            if worker._stop_requested:  # asked to stop during the take just done
                raise StopRequested()
            self.claims.wait(timeout)
        finally:
            worker._waiting = False

    def _take(self) -> tuple[Job, Queue] | None:
        """One claim: the job taken and its queue, or None."""
        worker: Any = self
        queues = list(worker._ordered_queues)
        taken = self.claims.take(worker.name, [(queue.name, queue.key) for queue in queues])
        if taken is None:
            return None
        index, job_id, data = taken
        queue = queues[index]
        job = worker.job_class(job_id, connection=worker.connection, serializer=worker.serializer)
        job.restore(data)
        worker.reorder_queues(reference_queue=queue)
        job.redis_server_version = worker.get_redis_server_version()
        worker.log.info("Worker %s: %s: %s", worker.name, queue.name, job.id)
        return job, queue

    def _unclaim(self, job: Job, pipe: Any) -> None:
        """On the pipeline that records ``job``'s execution (RQ's started registry): its claim goes."""
        worker: Any = self
        pipe.lrem(keys.job_claims(worker.name), -1, job.id)

    def prepare_execution(self, job: Job) -> Execution:
        """RQ's ``prepare_execution`` (the fork and spawn workers, before the work horse) with :meth:`_unclaim`
        in its pipeline."""
        worker: Any = self
        with worker.connection.pipeline() as pipe:
            execution = Execution.create(job, worker.get_heartbeat_ttl(job), pipeline=pipe, worker_name=worker.name)
            worker.executions[execution.id] = execution
            worker.set_state(WorkerStatus.BUSY, pipeline=pipe)
            self._unclaim(job, pipe)
            pipe.execute()
        return execution
