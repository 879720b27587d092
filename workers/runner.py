"""run_task: the only function RQ runs. It owns one delivery of a task from start to end.

Start and finish are compare-and-sets on the task (see app.core.scripts): a second delivery of the same
job finds the task PROCESSING and does nothing; a finish after a cancel, a recovery or an expiry
writes nothing (and the processor's files are removed). This is the one place that catches broad
exceptions, and it records every one of them.

A run owns the task only while its claim (the run id in the task) holds. Housekeeping takes the claim
of a run whose heartbeat went stale (a stopped or starved process) and re-queues the task under a new
job id; if the old run wakes up, its next heartbeat or progress write is answered "taken" and its
next cancellation point stops it. Its files live in a result folder of its own (app.core.results), so what it
writes on its way out never touches the files of the run that took over; its RQ job is not the re-queued
one, so RQ's cleanup of it does not take the new job along.

A run is fenced: its progress, checkpoints and item outcomes are compare-and-sets on its run id, and its ending
(complete, fail, retry, put back, stop, or the end after a grace: workers.heartbeat) is one decision
(:meth:`Heartbeat.decide`), taken once, by one thread. Files are removed only after that decision's
compare-and-set, and never a folder the task still names: its checkpoint's, its current run's, its result's
(:func:`workers.heartbeat.discard`). So a run that wakes up after another took over, even one that resumed in
its folder and completed, removes nothing of it.
Those endings are workers.endings'; this module starts the delivery, builds its context and calls the
processor.

A run resumes from the checkpoint earlier runs saved (workers.checkpoint): its context skips the items
they did, its processor reads back their cursor, and it works in the result folder of the run that saved
the checkpoint (so a half-written export is there to continue). When the worker stops (SIGTERM: a deploy, a
restart), :meth:`Runner.interrupt` makes the run stop at its next cancellation point; the run saves its
checkpoint and puts the task back on its queue without using an attempt. A run that does not get there
within the stop grace (``TASKPORT_STOP_GRACE``) is put back all the same, from its last checkpoint, and its
process ends.

How a delivery ended is what :func:`run_task` returns to RQ: a :class:`RunEnd` when it ended its task COMPLETED or
FAILED (the worker files the job in RQ's finished or failed registry, with the task's code and message as the
failure's text: workers.outcome.RecordsOutcome), None for a delivery that changed nothing of the task's end
(ignored, retried, put back, stopped, taken over: RQ deletes its job). A retry is taskport's own: the task
waits out its backoff in keys.DELAYED and the scheduler's promote tick queues it (app.core.deferred), so it
never depends on which worker holds RQ's scheduler lock.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Any

import redis
from rq import get_current_job
from rq.timeouts import JobTimeoutException

from app.core import keys, processors, tracing
from app.core.answers import Claim, Started
from app.core.clock import now_ms
from app.core.config import Config, WorkerClass
from app.core.connection import connect
from app.core.ids import new_run_id
from app.core.jobs import JobQueue
from app.core.keys import TaskField as F
from app.core.limits import concurrency_spec
from app.core.logs import task_logger
from app.core.output import OutputLog
from app.core.packer import use_lean_packer
from app.core.process import die_with_parent
from app.core.results import ResultStore, StoreUnavailable, remove_runs, result_store
from app.core.states import ERROR_MESSAGES, ErrorCode, TaskStatus
from app.core.store import TaskStore
from app.core.task import Task
from workers.batchview import BatchView
from workers.checkpoint import Resume, Saved
from workers.context import TaskContext
from workers.endings import Endings, Refused, Run, RunEnd
from workers.exceptions import RateDeferred, TaskCancelled, TaskError, TaskInterrupted
from workers.heartbeat import Heartbeat, needed_folders
from workers.ratelimit import RateLimiter
from workers.requeued import requeued_from_failed, run_requeued

log = logging.getLogger(__name__)


class Runner(Endings):
    """Everything a delivery needs, built once per worker process (before RQ forks its work horses). How a run
    ends (complete, fail, retry, put back, defer, stop) is in the :class:`~workers.endings.Endings` it mixes in."""

    def __init__(self, config: Config, conn: redis.Redis | None = None, results: ResultStore | None = None) -> None:
        self.config = config
        if conn is None:
            conn = connect(config)
            use_lean_packer(conn)  # the same bytes, less CPU per command (app.core.packer)
        self.store = TaskStore(conn, config)
        self.jobs = JobQueue(self.store.redis, config)
        self.output = OutputLog(self.store)
        self.results = results if results is not None else result_store(config)
        self.owner_pid = os.getpid()
        self.current: Heartbeat | None = None  # the run in progress in this process
        processors.load(config.processor_modules)
        tracing.setup("worker")  # OpenTelemetry, when the otel extra is installed and OTEL_* ask for it
        self.concurrency = concurrency_spec(config)  # the concurrency limits START applies (app.core.limits)
        self._prestarted: tuple[str, str, Claim] | None = None  # (task id, run id, START's answer): see start_on
        # the simple worker's RQ name (workers.worker sets it), kept in the task hash while its run holds it: where a
        # cancel's stop-job goes. '' in a fork or spawn worker's horse, whose job hash names the worker (RQ's own)
        self.worker = ""

    def start_on(self, pipe: Any, task_id: str) -> Callable[[Any], None]:
        """The simple worker's start of a delivery in its own round trip: START queued on ``pipe`` (the pipeline,
        without MULTI, that records the job's start in RQ, after those writes), and the function that takes its
        reply, which :meth:`run` of the same task then uses instead of starting it again. One round trip a
        delivery fewer (bench/README.md, "A delivery, command by command")."""
        run_id = new_run_id()
        self.store.start_on(pipe, task_id, run_id, self.concurrency, self.worker)

        def started(reply: Any) -> None:
            # an error reply (NOSCRIPT: an emptied script cache; a write refused) wrote nothing: the run starts
            # itself, as without a prestart, inside RQ's perform_job, where an error takes RQ's failure path
            if not isinstance(reply, Exception):
                self._prestarted = (task_id, run_id, self.store.claim_of(task_id, reply))
        return started

    def forget_start(self) -> None:
        """A delivery's prestarted claim that :meth:`run` did not take (it never ran) is not used by a later one."""
        self._prestarted = None

    def run(self, task_id: str) -> RunEnd | None:
        if os.getpid() != self.owner_pid:
            self._adopt_work_horse()
        tlog = task_logger(log, task_id)
        prestarted, self._prestarted = self._prestarted, None
        if prestarted is not None and prestarted[0] == task_id:
            run_id, claim = prestarted[1], prestarted[2]
        else:
            run_id = new_run_id()
            claim = self.store.start(task_id, run_id, self.concurrency, self.worker)
        if claim.parked:
            tlog.info("parked: %s (it waits in PENDING for a slot, holding no worker)", claim.parked)
            return None
        started = claim.started
        if started is None:
            return self._not_started(task_id, claim.status, tlog)
        task = started.task
        resume = Resume.parse(started.checkpoint, started.cursor)
        tlog.info("started %s, attempt %d of %d%s", task.type, task.attempts, task.max_attempts,
                  f", resuming from its checkpoint ({resume.items_done} items done)" if resume else "")
        ctx = self._context(task, run_id, resume, tlog)
        if task.attempts > 1 or resume is not None:
            self._prune(task_id, ctx, tlog)
        beat = Heartbeat(self.store, task_id, run_id, ctx, self.config.heartbeat_interval,
                         put_back=lambda why: self._put_back(run, why))
        run = Run(task, run_id, ctx, beat, tlog)
        parent = self.store.redis.hget(keys.task(task_id), F.TRACEPARENT) if tracing.ON else None
        with tracing.run_span(parent, task_id, task.type, run_id, task.attempts, resume is not None,
                              flush=self.config.worker_class != WorkerClass.SIMPLE) as span:
            end = self._beating(started, run)
            tracing.outcome(span, end.status.lower() if end is not None else "not ended",
                            end.describe() if end is not None and end.status == TaskStatus.FAILED else "")
            return end

    def _beating(self, started: Started, run: Run) -> RunEnd | None:
        """The run, its heartbeat beating."""
        with run.beat:
            self.current = run.beat
            try:
                return self._execute(started, run)
            except redis.ConnectionError as exc:  # past the ride-out, or no replica took the outcome in time
                run.tlog.warning("outcome not confirmed (%s): if a failover loses it, housekeeping recovers the run "
                                 "as after a crash", exc)
                return None
            finally:
                self.current = None

    def _not_started(self, task_id: str, status: str, tlog: logging.LoggerAdapter) -> RunEnd | None:
        """A delivery that found its task not PENDING: ignored, unless RQ's own tools put its job back from the
        failed registry (workers.requeued): then the task runs again, or the job is filed back saying why not."""
        job = get_current_job()
        if not requeued_from_failed(job):
            tlog.info("delivery ignored: task is %s", status or "gone")
            return None
        assert job is not None
        why = run_requeued(self.store, self.jobs, self.results, task_id, status, job.id, tlog)
        return None if why is None else Refused(TaskStatus.FAILED, message=why)

    def _context(self, task: Task, run_id: str, resume: Resume | None, tlog: logging.LoggerAdapter) -> TaskContext:
        """The run's context: resumed from ``resume``, in the result folder of the run that saved it."""
        folder = task.checkpoint_run if resume is not None and task.checkpoint_run else run_id

        def report(progress: int | None, message: str, items: dict | None, saved: Saved | None) -> str:
            if saved is None:
                return self.store.report(task.id, run_id, progress, message, items)
            return self.store.report(task.id, run_id, progress, message, items, checkpoint=saved.line,
                                     cursor=saved.cursor, files_run=folder, replace=saved.replace)

        def emit(lines: list[bytes], skipped: int) -> str:
            return self.output.emit(task.id, run_id, lines, now_ms(), skipped)

        ctx = TaskContext(task.id, report, results=self.results.for_run(folder),
                          interval=self.config.progress_interval, logger=tlog, resume=resume, emit=emit,
                          output_limits=self.config.output_caps)
        if task.then_of:  # a batch's then task reads its batch (workers.batchview)
            ctx.batch = BatchView(self.store, self.results, task.then_of)
        ctx.limiter = RateLimiter(self.store, self.config, task.id)  # ctx.limit's tokens
        return ctx

    def interrupt(self) -> None:
        """The worker is stopping: the run in progress stops at its next cancellation point and is put back
        on its queue; if it is not back within ``Config.stop_grace`` seconds, it is put back anyway and this
        process ends. Takes no lock: safe in a signal handler."""
        beat = self.current
        if beat is not None:
            beat.interrupt(self.config.stop_grace)

    def _adopt_work_horse(self) -> None:
        """In a forked work horse (once per horse: each runs one job): die with the worker, since an
        orphan would hold on to the task and to a process manager's pipes (stall recovery takes the
        task over), and talk to Redis over the connection RQ already opened here, not a new one."""
        die_with_parent(signal.SIGKILL)
        job = get_current_job()
        if job is not None:
            self.store = TaskStore(job.connection, self.config)
            self.jobs = JobQueue(job.connection, self.config)
            self.output = OutputLog(self.store)
        self.owner_pid = os.getpid()
        # RQ's horse dies on SIGTERM; here it stops the run gracefully instead (the worker forwards its own
        # SIGTERM, and a platform may signal the whole process group)
        signal.signal(signal.SIGTERM, lambda signum, frame: self.interrupt())

    def _execute(self, started: Started, run: Run) -> RunEnd | None:
        task = started.task
        proc = processors.get(task.type)
        try:
            if proc is None:
                raise LookupError(f"no processor registered for {task.type!r} in this worker")
            try:
                output = proc.func(started.payload, run.ctx)
            finally:
                run.ctx.flush_output()  # every line emitted reaches Redis before the run's end is written
        except RateDeferred as exc:
            self._defer(run, exc)
            return None
        except TaskInterrupted:
            self._put_back(run, "stopped at a cancellation point")
            return None
        except TaskCancelled:
            self._stopped(run)
            return None
        except TaskError as exc:
            return self._fail(run, exc.code, exc.message)
        except JobTimeoutException:
            return self._fail(run, ErrorCode.TIMEOUT, ERROR_MESSAGES[ErrorCode.TIMEOUT])
        except StoreUnavailable as exc:  # the processor's own writes to the result store
            return self._store_down(run, exc)
        except Exception:
            if self._claim_lost(run):  # e.g. a later run removed what this one was writing
                self._stopped(run)
                return None
            run.tlog.exception("processor raised (attempt %d of %d)", task.attempts, task.max_attempts)
            return self._retry_or_fail(run)
        return self._complete(run, output)

    @staticmethod
    def _prune(task_id: str, ctx: TaskContext, tlog: logging.LoggerAdapter) -> None:
        """Remove whatever earlier, lost or taken-over runs left half-written (the orphan sweep catches
        what a store outage leaves here)."""
        try:
            ctx.results.prune(task_id)
        except StoreUnavailable as exc:
            tlog.warning("could not remove earlier runs' files (left to the orphan sweep): %s", exc)


_runner: Runner | None = None  # the process's Runner: see use()


def use(runner: Runner | None) -> Runner | None:
    """Make ``runner`` the Runner of this process's RQ entry points (:func:`run_task`, :func:`on_stopped`,
    :func:`stop_current`) and return it; ``None`` forgets it, so the next delivery builds one from the
    environment. The worker installs its own through :func:`prepare`; tests and the bench hand in one
    on their own connection (fakeredis, a counting client)."""
    global _runner
    _runner = runner
    return runner


def prepare(config: Config) -> Runner:
    """Build the process's Runner (the worker calls this before it starts forking)."""
    runner = Runner(config)
    use(runner)
    return runner


def stop_current(job_id: str | None) -> None:
    """RQ's stop-job command reached an in-process (simple) worker: stop the run in progress, if it is
    that job's (ended after CANCEL_GRACE if the processor does not notice)."""
    runner = _runner
    beat = runner.current if runner is not None else None
    if beat is not None:
        beat.abandon(f"job {job_id} was stopped")


def interrupt_current() -> None:
    """The worker is stopping (SIGTERM): the run in progress in this process, if any, stops gracefully (see
    :meth:`Runner.interrupt`). Called from a signal handler: takes no lock."""
    runner = _runner
    if runner is not None:
        runner.interrupt()


def on_stopped(job: Any, connection: Any) -> None:
    """RQ calls this in the worker once it killed a cancelled task's work horse (fork and spawn
    workers): the horse had no chance to clean up, so its partial files go here. Which run the horse ran is
    not known here, so every run folder the task does not name goes: listed before the task is read, so the
    folder of a run that starts meanwhile (the task run again) is not among them."""
    runner = _runner or prepare(Config.from_env())
    task_id = job.args[0]  # the job id is the task id only for the first delivery chain (see app.core.jobs)
    tlog = task_logger(log, task_id)
    try:
        runs = runner.results.runs(task_id)
    except StoreUnavailable as exc:
        tlog.warning("work horse stopped; its partial files are left to the orphan sweep: %s", exc)
        return
    needed = needed_folders(runner.store, task_id)
    remove_runs(runner.results, task_id, [run for run in runs if run not in needed])
    tlog.info("work horse stopped; its partial files were removed")


def active() -> Runner:
    """The process's Runner, built from the environment on first use."""
    return _runner or prepare(Config.from_env())


def run_task(task_id: str) -> RunEnd | None:
    """RQ's entry point: run one delivery of the task; a returned RunEnd says how it ended the task (see the
    module docstring)."""
    return active().run(task_id)
