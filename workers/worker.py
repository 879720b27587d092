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
in that slot (workers.takeover), and every worker's registration in RQ expires soon after its process dies
(workers.lease): RQ lists live workers only.

What operators see of a task in RQ is its end (workers.outcome): a COMPLETED task's job sits in the
finished registry for ``FINISHED_JOB_TTL``, a FAILED one's in the failed registry with the task's code and
message. A queue an operator paused (``taskport pause QUEUE``) gives no job to any worker until it is resumed
(workers.dequeue, which also takes each job through a claim); the other queues are served as before.
This module puts those mixins together into the worker classes, and builds and runs the worker.
"""

from __future__ import annotations

import _signal
import logging
import signal
import time
from datetime import datetime
from typing import Any, cast
from uuid import uuid4

import rq.job
import rq.registry
from rq import Queue, SimpleWorker
from rq import Worker as RQWorker
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry
from rq.results import Result
from rq.serializers import DefaultSerializer, resolve_serializer
from rq.timeouts import UnixSignalDeathPenalty
from rq.utils import current_timestamp, now, str_to_date
from rq.worker import BaseWorker, WorkerStatus
from rq.worker import SpawnWorker as RQSpawnWorker

from app.core import layout
from app.core.clock import rq_time
from app.core.config import Config, WorkerClass
from app.core.connection import connect, ride_out_outages, wait_for_redis
from app.core.jobs import FINISHED_JOB_TTL, RUN_TASK, register_queues
from app.core.logs import rq_log_level, setup_logging
from app.core.lua import Command
from app.core.packer import use_lean_packer
from app.core.process import forked_children_die_with_me
from app.core.states import QUEUES
from workers.dequeue import HonoursPauses
from workers.lease import Leased, lease_seconds
from workers.outcome import CancelAware, RecordsOutcome, record_stopped_as_canceled
from workers.stopping import GracefulStop, PromptUnsubscribe
from workers.takeover import give_back_claims, replace_predecessor

log = logging.getLogger(__name__)


def _resolved_serializer(serializer: Any = None) -> Any:
    """``rq.serializers.resolve_serializer``, less its check of RQ's own default serializer, which is what every
    taskport job and registry has: the check is an isinstance of a runtime-checkable Protocol, which Python 3.11
    works out from scratch each time (two walks of the Protocol's attributes), and RQ makes it five times a
    delivery (the job, and each registry object its start and end name): ~6% of a no-op delivery's worker CPU
    (bench/README.md, "Worker CPU"). It answers the same object RQ's would; any other serializer takes RQ's."""
    return serializer if serializer is DefaultSerializer else resolve_serializer(serializer)


def _job_time(date_str: bytes | str) -> datetime:
    """``rq.utils.str_to_date`` (how ``Job.restore`` reads a job's times: created_at, enqueued_at... twice a
    delivery), by ``datetime.fromisoformat`` for the one text RQ writes (``2026-11-29T10:00:00.120345Z``): the same
    UTC datetime at a hundredth of strptime's cost (~2% of a no-op delivery's worker CPU). Any other text is RQ's
    to read (or refuse)."""
    found = date_str.decode() if isinstance(date_str, bytes) else date_str
    if len(found) == 27 and found[10] == "T" and found[19] == "." and found[26] == "Z":
        try:
            return datetime.fromisoformat(found)
        except ValueError:
            pass
    return str_to_date(date_str)


for _module in (rq.job, rq.registry):  # where a delivery builds its Job and its registries
    _module.resolve_serializer = _resolved_serializer  # type: ignore[attr-defined]
rq.job.str_to_date = _job_time


_SIGALRM, _SIG_DFL = int(signal.SIGALRM), int(signal.SIG_DFL)


class LeanSignalDeathPenalty(UnixSignalDeathPenalty):
    """RQ's job timeout in the worker process (``UnixSignalDeathPenalty``): the same handler installed for SIGALRM
    and the same alarm set before the job, the alarm cleared and the default action put back after it, in that
    order, through the C module ``_signal``. The ``signal`` module's wrappers turn each handler and number into
    and out of an enum on every call (``Handlers(handler)`` raises and catches a ValueError for a function): ~4 of
    the ~6 µs the four calls cost a delivery (bench/README.md, "Worker CPU, fourth pass"). Unix only, as RQ's."""

    def setup_death_penalty(self) -> None:
        _signal.signal(_SIGALRM, self.handle_death_penalty)
        _signal.alarm(self._timeout)

    def cancel_death_penalty(self) -> None:
        _signal.alarm(0)
        _signal.signal(_SIGALRM, _SIG_DFL)


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

    death_penalty_class = LeanSignalDeathPenalty  # RQ's default here (Unix), a few µs cheaper a delivery
    HEARTBEAT_EVERY = 1.0
    SUSPENSION_EVERY = 1.0
    COUNTS_EVERY = 1.0  # the worker's job counters reach Redis at most this often (and when it stops)
    _hb_sent = 0.0  # monotonic time of the last heartbeat
    _counts_sent = 0.0  # monotonic time the job counters were last written
    _succeeded = 0  # jobs succeeded since then
    _worked = 0.0  # seconds of work since then
    _hb_until = 0.0  # monotonic time at which the last heartbeat's expiry runs out
    _suspension_checked = -SUSPENSION_EVERY  # monotonic time of the last `rq suspend` check
    _prepared: str | None = None  # id of the job execute_job already prepared (see prepare_job_execution)
    # its state goes IDLE when a take finds nothing (workers.dequeue), not after each job: a worker that takes its
    # next job at once stays BUSY, two HSETs a delivery fewer under load; `rq info` and rq-dashboard show it idle
    # from the moment it has nothing to do, as before
    IDLE_WHEN_TAKEN_NOTHING = True

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        ttl = self.lease_ttl(timeout)
        now = time.monotonic()
        recent = now - self._hb_sent < self.HEARTBEAT_EVERY
        if recent and now + ttl <= self._hb_until + self.HEARTBEAT_EVERY:
            return  # on a job's start pipeline too: three commands a delivery (bench/README.md)
        super().heartbeat(timeout, pipeline)
        self._hb_sent, self._hb_until = now, now + ttl

    def increment_successful_job_count(self, pipeline: Any = None) -> None:
        self._succeeded += 1
        self._flush_counts(pipeline)

    def increment_total_working_time(self, job_execution_time: Any, pipeline: Any = None) -> None:
        self._worked += job_execution_time.total_seconds()
        self._flush_counts(pipeline)

    def _flush_counts(self, pipeline: Any = None, *, now: bool = False) -> None:
        """RQ's worker statistics (``successful_job_count``, ``total_working_time``: what ``rq info`` and
        rq-dashboard show), written at most once per ``COUNTS_EVERY`` s instead of two commands per job, and
        when the worker stops (:meth:`register_death`). A worker killed outright loses at most that second's."""
        if not (self._succeeded or self._worked) or (
                not now and time.monotonic() - self._counts_sent < self.COUNTS_EVERY):
            return
        conn = pipeline if pipeline is not None else self.connection
        if self._succeeded:
            conn.hincrby(self.key, "successful_job_count", self._succeeded)
        if self._worked:
            conn.hincrbyfloat(self.key, "total_working_time", self._worked)
        self._succeeded, self._worked, self._counts_sent = 0, 0.0, time.monotonic()

    def register_death(self) -> None:
        self._flush_counts(now=True)
        super().register_death()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        if state == self.get_state():
            return  # RQ writes IDLE after each job and again before each dequeue
        super().set_state(state, pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        if time.monotonic() - self._suspension_checked < self.SUSPENSION_EVERY:
            return
        super().check_for_suspension(burst)
        self._suspension_checked = time.monotonic()

    def execute_job(self, job: Job, queue: Queue) -> None:
        """RQ's SimpleWorker.execute_job, with the execution (a taskport job's: :meth:`_recorded_start`) and the
        job's start in one pipeline. Not a MULTI (two commands a delivery saved): what RQ writes of a start is its
        own worker's keys and the job's, which no one else writes meanwhile; the job's claim (app.core.jobclaims)
        is cleared after the started state (and, for another job than taskport's, RQ's started registry) is written.
        A taskport job's START goes last on it (workers.runner.Runner.start_on): one round trip for the start, where
        it took two."""
        from workers import runner  # late, as workers.worker.main imports it
        with self.connection.pipeline(transaction=False) as pipe:
            ttl = self.get_heartbeat_ttl(job)
            if job.func_name == RUN_TASK:
                execution = self._recorded_start(job, ttl, pipe)
            else:
                execution = Execution.create(job, ttl, pipeline=pipe, worker_name=self.name)
                self._start_job(job, ttl, pipe)
            self.executions[execution.id] = execution
            self.set_state(WorkerStatus.BUSY, pipeline=pipe)
            # the id leaves the claim list before START makes the task PROCESSING: cut short between the two, the task
            # is PENDING with its job nowhere, which RECONCILE puts back (workers.housekeeping)
            self._unclaim(job, pipe)
            # a taskport job's START in the same round trip, after those writes (Runner.start_on), naming this worker
            started = None
            if job.func_name == RUN_TASK:
                active = runner.active()
                active.worker = self.name
                started = active.start_on(pipe, job.args[0])
            replies = pipe.execute(raise_on_error=started is None)
        if started is not None:
            for reply in replies[:-1]:
                if isinstance(reply, Exception):
                    raise reply
            started(replies[-1])
        self._prepared = job.id
        run = runner.active() if started is not None else None
        if run is not None:  # its end in RQ goes with the task's completion (see _finish_completed)
            run.rq_finish, run.rq_finished = lambda: self._finish_commands(job, queue, execution), False
        try:
            self.perform_job(job, queue, execution)  # no IDLE after it: see IDLE_WHEN_TAKEN_NOTHING
        finally:
            if run is not None:
                run.forget_start()
                run.rq_finish, run.rq_finished = None, False

    def _recorded_start(self, job: Job, ttl: int, pipe: Any) -> Execution:
        """A taskport job's start in RQ, on the start pipeline: the worker's heartbeat (coalesced) and nothing of
        the job. Its started state (status, started_at, worker_name, last_heartbeat in the job hash), an execution
        record, the indexes of the worker's executions and of the job's, and a started registry entry are each a
        copy of what the task hash and ``{tp}:running`` hold (START, on the same pipeline, writes them): six
        commands here and three at the end (bench/README.md, "A delivery, command by command" and "A delivery,
        third round"). The worker's name is the task's (F.WORKER, written by START): a cancel's stop-job command
        goes there (app.core.scripts.TRANSITION) and workers.takeover finds a dead worker's run by it. The
        execution lives in this process's memory (``self.executions``), which is where RQ's stop-job command
        looks; another process (rq-dashboard, ``rq info``, ``Worker.all()``) sees no current job for this worker,
        no "started" job, and the job as queued until it ends: the decision issue 32 allows (docs/operations.md)."""
        self._start_job(job, ttl, pipe, write=False)
        execution = Execution(id=uuid4().hex, job_id=job.id, connection=self.connection, worker_name=self.name)
        execution._job = job
        return execution

    def _finish_commands(self, job: Job, queue: Queue, execution: Execution) -> list[Command]:
        """What :meth:`RecordsOutcome._finish_completed` writes of a completed job's end in RQ (the job FINISHED in
        the finished registry for ``FINISHED_JOB_TTL``), as commands that
        the task's completion replays in its own step (app.core.scripts.TRANSITION's job commands), only when
        it wins: the finish's round trip and its MULTI go, and RQ's record of the end can no longer disagree
        with the task's. Nothing of the execution: :meth:`_recorded_start` wrote none of it to Redis. The job's
        start time and worker, which :meth:`_recorded_start` does not write, go in the same HSET: rq-dashboard's
        finished list and job page show them as before, at no command more.
        Written out as RQ 3.0's calls send them (``Job`` fields, ``BaseRegistry.add``'s score: now + TTL, its member
        the job id; tests/unit/test_rq_steps.py holds them equal): they are built between the processor's return
        and the end's send, and recording RQ's calls on a pipeline took ~30 µs of that (bench/README.md, "The end
        on the next claim's pipeline")."""
        assert job.started_at is not None
        return [Command("HSET", job.key, ("status", JobStatus.FINISHED.value, "ended_at", rq_time(now()),
                                          "started_at", rq_time(job.started_at), "worker_name", self.name)),
                Command("EXPIRE", job.key, (FINISHED_JOB_TTL,)),
                Command("ZADD", FinishedJobRegistry.key_template.format(queue.name),
                        (current_timestamp() + FINISHED_JOB_TTL, job.id))]

    def _finish_completed(self, job: Job, queue: Queue, execution: Execution) -> None:
        from workers import runner
        if not runner.active().rq_finished:
            super()._finish_completed(job, queue, execution)
            return
        assert job.started_at is not None and job.ended_at is not None
        self.executions.pop(execution.id, None)  # what cleanup_execution does here; Redis has the rest already
        self.increment_successful_job_count()
        self.increment_total_working_time(job.ended_at - job.started_at)

    def _start_job(self, job: Job, ttl: int, pipe: Any, *, write: bool = True) -> None:
        """What RQ's prepare_job_execution writes (with three queues it has no intermediate queue to trim). The
        job's part is RQ's ``Job.prepare_for_execution`` (with last_heartbeat: RQ's job.heartbeat is its twin),
        the same fields and texts, its two times formatted once by app.core.clock.rq_time (strftime was ~3% of a
        no-op delivery's worker CPU). ``write=False``: the job's part in this process's Job alone (a taskport
        job's: :meth:`_recorded_start`)."""
        self.heartbeat(ttl, pipeline=pipe)
        job.worker_name, job._status = self.name, JobStatus.STARTED
        job.last_heartbeat = job.started_at = now()
        if not write:
            return
        at = rq_time(job.started_at)
        pipe.hset(job.key, mapping={"last_heartbeat": at, "status": JobStatus.STARTED, "started_at": at,
                                    "worker_name": self.name})
        pipe.persist(job.key)

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
            pipe.execute()

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
    if config.worker_class != WorkerClass.SPAWN:  # RQ writes a spawn horse's connection arguments as literals
        use_lean_packer(conn)  # the same bytes, less CPU per command (app.core.packer)
    wait_for_redis(conn)
    layout.upgrade(conn)  # a Redis of an earlier key layout: before any run is taken over (app.core.layout)
    register_queues(conn)
    if name:
        replace_predecessor(conn, config, name)
        give_back_claims(conn, name)
    worker: Any = WORKER_CLASSES[config.worker_class](list(QUEUES), name=name, connection=conn)
    worker.lease = lease_seconds(config)
    return cast(BaseWorker, worker)



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
    # RQ's per-job INFO lines repeat taskport's own (app.core.logs.rq_log_level)
    worker.work(with_scheduler=True, logging_level=rq_log_level(config), max_jobs=config.worker_max_jobs or None)
    return 0
