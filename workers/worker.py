"""``taskport worker``: one RQ worker process listening on the queues high, default, low (in that order),
and the RQ worker classes it runs (``WORKER_CLASSES``, one per value of ``TASKPORT_WORKER_CLASS``).

It runs RQ's own scheduler alongside (``with_scheduler=True``) for jobs scheduled through RQ itself; a task's
retry with backoff does not use it: it waits in ``keys.DELAYED`` and the scheduler process's promote tick
queues it on time (app.core.deferred). SIGTERM or SIGINT is a graceful stop
(workers.stopping): the running task is put back on its queue from its checkpoint, and the worker exits;
a second signal changes nothing.

While Redis is unreachable every Redis command waits for it to come back (``ride_out_outages``), so the
worker, its work horse and RQ's scheduler ride out a restart of the embedded redis-server.

A worker under a slot's name (``taskport up``'s supervisor, a dyno) takes over from a predecessor that died
in that slot (:func:`replace_predecessor`), and every worker's registration in RQ expires soon after its
process dies (:class:`Leased`): RQ lists live workers only.

What operators see of a task in RQ is its end (:class:`RecordsOutcome`): a COMPLETED task's job sits in the
finished registry for ``FINISHED_JOB_TTL``, a FAILED one's in the failed registry with the task's code and
message. A queue an operator paused (``taskport pause QUEUE``) gives no job to any worker until it is resumed
(:class:`HonoursPauses`); the other queues are served as before.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, cast

import redis
from rq import Queue, SimpleWorker, worker_registration
from rq import Worker as RQWorker
from rq.exceptions import NoSuchJobError, StopRequested
from rq.executions import Execution, ExecutionRegistry
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.registry import CanceledJobRegistry, StartedJobRegistry
from rq.results import Result
from rq.utils import as_text, now, utcformat, utcparse
from rq.worker import BaseWorker, WorkerStatus
from rq.worker import SpawnWorker as RQSpawnWorker

from app.core import keys, layout, processors
from app.core.config import Config, WorkerClass
from app.core.connection import connect, ride_out_outages, wait_for_redis
from app.core.jobclaims import WAKE_WAIT, Claims
from app.core.jobs import CANCELED_JOB_TTL, FINISHED_JOB_TTL, RUN_TASK, JobQueue, register_queues, task_of_job
from app.core.logs import setup_logging, task_logger
from app.core.process import forked_children_die_with_me
from app.core.states import QUEUES, TaskStatus
from app.core.store import TaskStore
from workers.housekeeping import recover_now
from workers.stopping import GracefulStop, PromptUnsubscribe

log = logging.getLogger(__name__)
LEASE_STALLS = 3  # a dead worker's registration expires this many stall timeouts after its last renewal
MIN_LEASE = 30  # seconds, however short the stall timeout
STOP_MARGIN = 2.0  # seconds past its stop grace a stopping predecessor may take to register its death


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

    ``run_task`` returns a :class:`workers.runner.RunEnd` when its delivery ended the task. FAILED: RQ's own
    failure path, with the task's code and message as the failure's text (never a traceback: nothing was
    raised), so the job sits in the failed registry for ``FAILED_JOB_TTL`` (rq-dashboard's Requeue runs the
    task again: app.web.requeue). COMPLETED: the job stays, in the finished registry, for ``FINISHED_JOB_TTL``
    (one MULTI; no result record: the task hash holds the result). Any other return (None, a ``Retry``) takes
    RQ's path as before: a delivery that changed nothing is deleted at once (``RESULT_TTL`` 0).
    """

    def _finalize_success(self, job: Job, queue: Queue, execution: Execution, return_value: Any) -> None:
        from workers.runner import RunEnd  # late, as runner itself: it loads the processors

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
            self._job_done(pipe)
            pipe.execute()

    def _job_done(self, pipe: Any) -> None:
        """Anything more the worker class writes with a job's end (the simple worker: its state)."""


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


class Leased:
    """Mixin for an RQ worker class (before it in the bases): its registration (``rq:worker:<name>`` and its
    executions index) expires ``lease`` seconds after it was last renewed, busy or idle, so a worker killed
    with SIGKILL (or OOM) leaves `rq info`, the dashboard and ``/readyz`` within that time.

    RQ's own expiry is much later: a busy simple worker's is the job's timeout + 60 s (an hour for
    ``demo.sleep``), an idle worker's its ``worker_ttl`` + 60 s (8 minutes), since nothing renews it while
    the worker waits on its queues or runs a job in-process. Here every RQ heartbeat is capped at the lease,
    and a thread renews it every third of the lease for as long as the process lives (one EXPIRE of each key,
    in one round trip). Should the registration be gone all the same (Redis was away for longer than the
    lease), the thread writes it again.
    """

    lease: int = LEASE_STALLS * 30  # seconds; build_worker sets it from the stall timeout (lease_seconds)
    _renewing: threading.Event | None = None

    def lease_ttl(self, timeout: int | None) -> int:
        """The expiry RQ asked for (``timeout``, else its worker_ttl + 60), capped at the lease."""
        worker: Any = self
        return min(timeout or worker.worker_ttl + 60, self.lease)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        super().heartbeat(self.lease_ttl(timeout), pipeline)  # type: ignore[misc]

    def register_birth(self) -> None:
        super().register_birth()  # type: ignore[misc]
        worker: Any = self
        worker.connection.expire(worker.key, self.lease)  # RQ's birth sets worker_ttl + 60
        self._renewing = threading.Event()
        threading.Thread(target=self._renew, args=(self._renewing,), name="rq-worker-lease", daemon=True).start()

    def register_death(self) -> None:
        if self._renewing is not None:
            self._renewing.set()
        super().register_death()  # type: ignore[misc]

    def _renew(self, stop: threading.Event) -> None:
        worker: Any = self
        while not stop.wait(self.lease / 3):
            try:
                with worker.connection.pipeline(transaction=False) as pipe:
                    pipe.expire(worker.key, self.lease)
                    pipe.expire(worker.executions_key, self.lease)
                    registered = pipe.execute()[0]
                if not registered and not stop.is_set():
                    self._register_again()
            except redis.RedisError as exc:  # Redis away: the next renewal tries again
                log.warning("worker %s: could not renew its registration: %s", worker.name, exc)

    def _register_again(self) -> None:
        worker: Any = self
        log.warning("worker %s: its registration had expired; registering again", worker.name)
        with worker.connection.pipeline() as pipe:
            pipe.hset(worker.key, mapping={**worker.serialize(), "state": worker.get_state()})
            worker_registration.register(worker, pipe)
            pipe.expire(worker.key, self.lease)
            pipe.execute()


def lease_seconds(config: Config) -> int:
    """How long a worker's registration outlives its process: ``LEASE_STALLS`` stall timeouts (90 s by
    default), at least ``MIN_LEASE``."""
    return max(MIN_LEASE, math.ceil(LEASE_STALLS * config.stall_timeout))


def cancel_aware(worker_class: type[Any]) -> type[Any]:
    """``worker_class`` with :class:`CancelAware`, the outcome records, the pauses, the graceful stop and the lease
    mixed in (same name, so RQ's listings read as before)."""
    return type(worker_class.__name__,
                (Leased, PromptUnsubscribe, GracefulStop, HonoursPauses, RecordsOutcome, CancelAware, worker_class), {})


# Module attributes of their own names: RQ's SpawnWorker pickles its class for the spawned work horse, and
# pickle finds a class by module and name (in a fresh interpreter, by importing this module).
Worker = cancel_aware(RQWorker)
SpawnWorker = cancel_aware(RQSpawnWorker)


class StoppableSimpleWorker(Leased, PromptUnsubscribe, GracefulStop, HonoursPauses, RecordsOutcome, SimpleWorker):
    """RQ's SimpleWorker (jobs run in the worker process), which ignores RQ's stop-job command; here the
    command stops the run in progress: at its next cancellation point, or by ending this process after
    ``workers.heartbeat.CANCEL_GRACE`` if it never reaches a cancellation point (the supervisor starts a new worker).

    Also coalesces RQ's worker heartbeats. RQ sends one, unpipelined (three round trips: HSET, EXPIRE,
    EXPIRE), before each dequeue, after it and after each job: 9 of the ~30 round trips of a no-op
    delivery. One that would not push the worker's expiry later than the last one set, within
    ``HEARTBEAT_EVERY`` seconds of it, is skipped (by more than that second); a heartbeat that extends
    the expiry further (before a long dequeue after a job with a short timeout, say) always goes out.
    The expiry in Redis therefore falls short of what RQ asked for by under ``HEARTBEAT_EVERY``
    (against a TTL of minutes), and ``last_heartbeat`` is at most that much older.

    And it folds RQ's other per-job bookkeeping into fewer round trips (bench/README.md, "Worker
    default"): the two pipelines that start a job (the execution record, then the job's started
    state) go as one; the worker's state is written only when it changes; ``rq suspend`` is checked
    at most once per ``SUSPENSION_EVERY`` seconds instead of before every job; and a taskport job that
    succeeded (see :meth:`_disposable`) is finished in one MULTI that deletes it, where RQ's
    ``result_ttl=0`` path first WATCHes its dependents and reads its status and executions back
    (8 round trips) only to delete what this worker already knows it wrote.
    """

    HEARTBEAT_EVERY = 1.0
    SUSPENSION_EVERY = 1.0
    _hb_sent = 0.0  # monotonic time of the last heartbeat
    _hb_until = 0.0  # monotonic time at which the last heartbeat's expiry runs out
    _suspension_checked = -SUSPENSION_EVERY  # monotonic time of the last `rq suspend` check
    _prepared: str | None = None  # id of the job execute_job already prepared (see prepare_job_execution)

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        ttl = self.lease_ttl(timeout)
        now = time.monotonic()
        recent = now - self._hb_sent < self.HEARTBEAT_EVERY
        if pipeline is None and recent and now + ttl <= self._hb_until + self.HEARTBEAT_EVERY:
            return
        super().heartbeat(timeout, pipeline)
        self._hb_sent, self._hb_until = now, now + ttl

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if pipeline is None and state == self.get_state():
            return  # RQ writes IDLE after each job and again before each dequeue
        super().set_state(state, pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        if time.monotonic() - self._suspension_checked < self.SUSPENSION_EVERY:
            return
        super().check_for_suspension(burst)
        self._suspension_checked = time.monotonic()

    def execute_job(self, job: Job, queue: Queue) -> None:
        """RQ's SimpleWorker.execute_job, with the execution record and the job's start in one pipeline. Not a
        MULTI (two commands a delivery saved): its last command clears the job's claim (app.core.jobclaims), so
        a pipeline cut short leaves the id in the claim list as well as in RQ's started registry, never in
        neither, and what RQ writes of a start is its own worker's keys and the job's, which no one else
        writes meanwhile."""
        with self.connection.pipeline(transaction=False) as pipe:
            ttl = self.get_heartbeat_ttl(job)
            execution = Execution.create(job, ttl, pipeline=pipe, worker_name=self.name)
            self.executions[execution.id] = execution
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            self._start_job(job, ttl, pipe)
            self._unclaim(job, pipe)  # last: the id is in RQ's started registry by then
            pipe.execute()
        self._prepared = job.id
        self.perform_job(job, queue, execution)
        self.set_state(WorkerStatus.IDLE)

    def _start_job(self, job: Job, ttl: int, pipe: Any) -> None:
        """What RQ's prepare_job_execution writes (with three queues it has no intermediate queue to trim)."""
        self.heartbeat(ttl, pipeline=pipe)
        job.heartbeat(now(), ttl, pipeline=pipe)
        job.prepare_for_execution(self.name, pipeline=pipe)
        if job.func_name != RUN_TASK:
            pipe.persist(job.key)  # taskport's own jobs are queued with no TTL (app.core.jobs): nothing to persist

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        if self._prepared == job.id and not remove_from_intermediate_queue:
            self._prepared = None
            self.procline(f"Processing {job.func_name} from {job.origin} since {time.time()}")
            return
        super().prepare_job_execution(job, remove_from_intermediate_queue)

    def _disposable(self, job: Job) -> bool:
        """Whether a successful job can be finished by :meth:`_finish_disposable`: one of taskport's
        (no dependents, repeats, group, rate limit, callback or webhook: app.core.jobs.JobQueue.job_commands
        sets none of them), whose result RQ would delete at once (``result_ttl=0``), not stopped."""
        return (job.func_name == RUN_TASK and job.get_result_ttl(self.default_result_ttl) == 0
                and not job.repeats_left and not job.group_id and not job.has_rate_limit
                and not job._success_callback_name and not job.webhooks
                and job.id != getattr(self, "_stopped_job_id", None))

    def _finalize_success(self, job: Job, queue: Queue, execution: Execution, return_value: Any) -> None:
        if return_value is not None or not self._disposable(job):  # a Retry, or an end (RecordsOutcome)
            super()._finalize_success(job, queue, execution, return_value)
            return
        job.ended_at = now()
        job._result = return_value
        job._status = JobStatus.FINISHED
        self._finish_disposable(job, execution)
        self.log.info("Worker %s: %s: Job OK (%s)", self.name, job.origin, job.id)

    def _finish_disposable(self, job: Job, execution: Execution) -> None:
        """RQ's handle_job_success for a ``result_ttl=0`` job, as one MULTI: the worker's counters, the
        execution's removal (started registry, execution registry, the worker's executions), the job's
        keys deleted, and the worker back to idle."""
        assert job.started_at is not None and job.ended_at is not None
        with self.connection.pipeline() as pipe:
            self.increment_successful_job_count(pipeline=pipe)
            self.increment_total_working_time(job.ended_at - job.started_at, pipe)
            self.cleanup_execution(job, pipeline=pipe, execution=execution)
            pipe.delete(job.key, job.dependents_key, job.dependencies_key, Result.get_key(job.id),
                        job.execution_registry.key)
            self.set_state(WorkerStatus.IDLE, pipeline=pipe)
            pipe.execute()

    def _job_done(self, pipe: Any) -> None:
        self.set_state(WorkerStatus.IDLE, pipeline=pipe)  # as _finish_disposable: execute_job's IDLE is then a no-op

    def kill_horse(self, sig: Any = None) -> None:
        from workers import runner

        runner.stop_current(self.get_current_job_id())

    def handle_job_success(self, job: Job, queue: Queue, *args: Any, **kwargs: Any) -> Any:
        """A job stopped on request (RQ set ``_stopped_job_id`` before calling :meth:`kill_horse`) ends as
        the fork worker's does: in the canceled registry (:class:`CancelAware`), not as a success."""
        done = super().handle_job_success(job, queue, *args, **kwargs)
        if job.id == getattr(self, "_stopped_job_id", None):
            self._stopped_job_id = None
            record_stopped_as_canceled(job)
        return done


# What each WorkerClass is (their differences: app.core.config.WorkerClass and docs/operations.md).
WORKER_CLASSES: dict[str, type[BaseWorker]] = {
    WorkerClass.FORK: Worker,
    WorkerClass.SIMPLE: StoppableSimpleWorker,  # a cancel ignored for heartbeat.CANCEL_GRACE ends the process
    WorkerClass.SPAWN: SpawnWorker,
}


def slot_name(config: Config, name: str | None) -> str | None:
    """The worker's RQ name: ``name`` (``--name``: ``taskport up`` gives each supervised worker its slot's,
    app.launch.supervisorconf), else the platform's name of the process (``DYNO`` on Heroku: ``worker.1``,
    one worker per dyno), else None (RQ's random one)."""
    return name or config.dyno or None


def build_worker(config: Config, name: str | None = None) -> BaseWorker:
    """The RQ worker of ``config.worker_class`` on our queues, connected to ``config.redis_url``.

    ``name`` is a slot's (see :func:`slot_name`; None: RQ's random one): one process at a time runs under it,
    so a registration left under that name is a dead predecessor's, which :func:`replace_predecessor` takes
    over before this worker registers.
    """
    conn = connect(config)
    wait_for_redis(conn)
    layout.upgrade(conn)  # a Redis of an earlier key layout: before any run is taken over (app.core.layout)
    register_queues(conn)
    if name:
        replace_predecessor(conn, config, name)
        _give_back_claims(conn, name)
    worker: Any = WORKER_CLASSES[config.worker_class](list(QUEUES), name=name, connection=conn)
    worker.lease = lease_seconds(config)
    return cast(BaseWorker, worker)


def replace_predecessor(conn: redis.Redis, config: Config, name: str) -> None:
    """Take over from the dead worker that ran under ``name`` before this one (its registration is still in
    RQ, with no death registered: it was killed, or died of OOM): recover the run it was making at once,
    without waiting for the stall timeout (workers.housekeeping.recover_now), then remove it from RQ's
    registries the way RQ records a dead worker and an abandoned job. One log line says what was done."""
    key = RQWorker.redis_worker_namespace_prefix + name
    if not _unclean(conn, key) or not _stopped_for_good(conn, key, config):
        return  # none, or it stopped cleanly (RQ registered its death)
    predecessor = RQWorker.find_by_key(key, connection=conn)
    if predecessor is None:
        return
    executions = predecessor.get_current_executions(refresh=True)
    for execution in executions:
        _take_over_run(conn, config, predecessor, execution)
    predecessor.register_death()  # out of RQ's worker sets; its hash goes 60 s later, its executions index now
    if not executions:
        log.info("worker %s replaced its dead predecessor (pid %s), which was idle", name, predecessor.pid)


def _give_back_claims(conn: redis.Redis, name: str) -> None:
    """The jobs a dead predecessor in slot ``name`` had taken and not started go back to the heads of their
    queues (app.core.jobclaims): after :func:`replace_predecessor`, so it is known dead."""
    back = Claims(conn).give_back(name)
    if back:
        log.warning("worker %s: %d job(s) its predecessor had taken but not started are back on their queues",
                    name, back)


def _unclean(conn: redis.Redis, key: str) -> bool:
    """Whether a worker is registered under ``key`` with no death registered."""
    with conn.pipeline(transaction=False) as pipe:
        pipe.exists(key)
        pipe.hexists(key, "death")
        exists, dead = pipe.execute()
    return bool(exists) and not dead


def _stopped_for_good(conn: redis.Redis, key: str, config: Config) -> bool:
    """False when the predecessor, asked to stop (RQ wrote its shutdown request), registered its death within
    its stop grace: it was alive, putting its run back (a platform may start a process's successor before
    the process is gone). Waits for that, at most until its grace is over; True when it is still unclean."""
    requested = conn.hget(key, "shutdown_requested_date")
    if requested:
        deadline = utcparse(as_text(requested)).timestamp() + config.stop_grace + STOP_MARGIN
        while time.time() < deadline and _unclean(conn, key):
            time.sleep(0.2)
    return _unclean(conn, key)


def _take_over_run(conn: redis.Redis, config: Config, predecessor: BaseWorker, execution: Execution) -> None:
    """The predecessor's ``execution``: its task recovered at once if it is still that job's run, the
    execution out of RQ's registries, its job recorded as abandoned (failed registry, as RQ's own clean-up of
    an abandoned job does, so it expires)."""
    task_id = task_of_job(execution.job_id)
    processors.load(config.processor_modules)  # the re-queued job's timeout is its processor's
    store = TaskStore(conn, config)
    recovered = recover_now(store, JobQueue(conn, config), task_id, execution.job_id)
    task = store.get(task_id) if recovered is None else None
    # its execution was recorded (the job out of the claim list) but the run never started: the job goes back
    unstarted = task is not None and task.status == TaskStatus.PENDING and store.job_id(task_id) == execution.job_id
    with conn.pipeline() as pipe:
        pipe.delete(execution.key)
        for queue in QUEUES:
            StartedJobRegistry(queue, connection=conn).remove_execution(execution, pipeline=pipe)
        ExecutionRegistry(execution.job_id, connection=conn).remove(execution, pipe)
        try:
            job = Job.fetch(execution.job_id, connection=conn)
        except NoSuchJobError:
            job = None
        if job is not None and unstarted:
            job.set_status(JobStatus.QUEUED, pipeline=pipe)
            pipe.lpush(Queue(job.origin, connection=conn).key, job.id)  # the head: it was next
            pipe.rpush(keys.JOB_WAKE, job.origin)
        elif job is not None and job.get_status(refresh=False) == JobStatus.STARTED:
            record_job_failure(job, f"abandoned: worker {predecessor.name} died running it", pipe)
        pipe.execute()
    tlog = task_logger(log, task_id)
    if job is not None and unstarted:
        tlog.warning("worker %s replaced its dead predecessor (pid %s), which died before job %s started: "
                     "it is back at the head of its queue", predecessor.name, predecessor.pid, job.id)
        return
    if recovered is None:
        tlog.info("worker %s replaced its dead predecessor (pid %s); its run of job %s had already ended or moved on",
                  predecessor.name, predecessor.pid, execution.job_id)
        return
    task, status = recovered
    how = ("from its checkpoint, no attempt used" if task.resumable else
           "run again, no attempt used" if status == TaskStatus.PENDING else "too many lost runs without progress")
    tlog.warning("worker %s replaced its dead predecessor (pid %s): its run recovered at once, now %s (%s)",
                 predecessor.name, predecessor.pid, status, how)


def main(config: Config, name: str | None = None) -> int:
    """Run one worker until it is told to stop; returns the process exit code."""
    setup_logging(config, "worker")
    ride_out_outages()  # a Redis restart is waited out, not a reason to quit (see app.core.connection)
    forked_children_die_with_me()  # RQ's scheduler child and the work horses go when the worker goes
    from workers import runner  # imported late: it loads the processors, which may import a lot

    worker = build_worker(config, slot_name(config, name))
    runner.prepare(config)  # loads the processors once, before the first fork, so work horses inherit them
    log.info("worker %s (%s) listening on %s", worker.name, config.worker_class, ", ".join(QUEUES))
    # after worker_max_jobs jobs the worker exits 0 and its supervisor starts a fresh one: whatever a
    # processor leaks in an in-process (simple) worker is bounded (bench/README.md, "Worker memory")
    worker.work(with_scheduler=True, logging_level=config.log_level.upper(), max_jobs=config.worker_max_jobs or None)
    return 0
