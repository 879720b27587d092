"""How a delivery ends: the ends a run can take once its processor returned or raised (complete, fail, retry,
put back, defer for a rate limit, stop), each taken through the run's one decision (workers.heartbeat
``Heartbeat.decide``) and one compare-and-set on the task, and what the worker files in RQ for it
(:class:`RunEnd`).

Its own module because the endings are the fenced half of a delivery: every write here is conditional on the run
still holding the task, and files are removed only after that (:func:`workers.heartbeat.discard`). The start of a
delivery, its context and the processor call are workers.runner's, whose :class:`~workers.runner.Runner` mixes
:class:`Endings` in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import redis

from app.core.answers import ResultNotStorable
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import JobQueue, resume_job_id, retry_job_id
from app.core.keys import STAT_RATE_DEFERRED, STAT_RETRIED
from app.core.keys import TaskField as F
from app.core.limits import deferred_job_id
from app.core.lua import Command
from app.core.results import StoreUnavailable, spill
from app.core.states import ERROR_MESSAGES, ErrorCode, TaskStatus
from app.core.store import TaskStore
from app.core.task import Task
from workers.context import TaskContext
from workers.exceptions import RateDeferred
from workers.heartbeat import Heartbeat, discard

# A rate limit's put-back waits at least this long (ms): the promote tick queues it under the job id of its next
# delivery (app.core.jobs.delayed_job_id), which may be this delivery's own, deleted by RQ as the delivery ends.
DEFER_MIN_MS = 1000


@dataclass(frozen=True)
class RunEnd:
    """A delivery that ended its task: ``status`` COMPLETED or FAILED, with the task's error code and message
    when FAILED. Only these go into the RQ job's record, so an operator reading rq-dashboard sees the same
    code and message as the task's status document, and never a traceback or the payload."""

    status: TaskStatus
    code: int | None = None
    message: str = ""

    def describe(self) -> str:
        """The text RQ keeps as the failure's ``exc_string`` (rq-dashboard's "Exception Info")."""
        return f"task FAILED with code {self.code}: {self.message}"


class Refused(RunEnd):
    """A requeue from RQ's failed registry that could not run the task again (workers.requeued): its job is filed
    back in the failed registry with why."""

    def describe(self) -> str:
        return f"requeue refused: {self.message}"


COMPLETED = RunEnd(TaskStatus.COMPLETED)


@dataclass(frozen=True)
class Run:
    """One delivery in progress: its task as started, its run id, context, heartbeat and logger."""

    task: Task
    run_id: str
    ctx: TaskContext
    beat: Heartbeat
    tlog: logging.LoggerAdapter


class Endings:
    """Mixin of :class:`~workers.runner.Runner`: the ends of a run (see the module docstring)."""

    config: Config
    store: TaskStore
    jobs: JobQueue
    # the simple worker's record of the job's end in RQ, written by the completion in the same step (set by
    # workers.worker for the delivery at hand, None otherwise), and whether the last completion wrote it
    rq_finish: Callable[[], Sequence[Command]] | None = None
    rq_finished = False

    def _put_back(self, run: Run, why: str) -> bool:
        """Save the run's checkpoint and put its task back on its queue, without using an attempt."""
        if not run.beat.decide():
            return False  # the run is ending on another path (completing, failing)
        task, ctx = run.task, run.ctx
        ctx.flush()
        job = resume_job_id(task.id, task.seq)
        commands = self.jobs.requeue_commands(task, job)
        done_items = ctx.item_counts
        where = f" after {done_items['succeeded'] + done_items['failed']} items" if done_items else ""
        message = f"interrupted by a worker stop{where}; resumes from its checkpoint"
        if not self.store.interrupted(task.id, run.run_id, message, commands, job):
            run.tlog.info("%s, but the task was cancelled, expired or taken over meanwhile", why)
            self._discard(run)
            return False
        run.tlog.info("%s: put back on queue %s%s, resumes from its checkpoint (no attempt used)", why,
                      task.priority, where)
        return True

    def _defer(self, run: Run, exc: RateDeferred) -> bool:
        """``ctx.limit`` would wait longer than a worker may be held: save the checkpoint and put the task back
        with a run_at when its token is due, without using an attempt (app.core.limits)."""
        if not run.beat.decide():
            return False
        task, ctx = run.task, run.ctx
        ctx.flush()
        run_at = now_ms() + max(DEFER_MIN_MS, int(exc.wait * 1000))
        message = f"waiting {exc.wait:.1f} s for rate limit {exc.name}; resumes from its checkpoint"
        if not self.store.defer(task.id, run.run_id, message, run_at, deferred_job_id(task), STAT_RATE_DEFERRED):
            run.tlog.info("rate limit %s: the task was cancelled, expired or taken over meanwhile", exc.name)
            self._discard(run)
            return False
        run.tlog.info("rate limit %s: put back for %.1f s (longer than the %g s a worker waits), no attempt used",
                      exc.name, exc.wait, self.config.rate_wait_max)
        return True

    def _store_down(self, run: Run, exc: StoreUnavailable) -> RunEnd | None:
        """The result store is unreachable: known and transient, so no traceback; -5 once no attempt is left."""
        run.tlog.warning("result store unavailable (attempt %d of %d): %s", run.task.attempts, run.task.max_attempts,
                         exc)
        return self._retry_or_fail(run, ErrorCode.RESULT_STORE)

    def _unstorable(self, run: Run, exc: Exception) -> RunEnd | None:
        run.tlog.error("output of %s cannot be stored: %s", run.task.id, exc)  # a known condition: no traceback
        return self._fail(run, ErrorCode.INTERNAL, ERROR_MESSAGES[ErrorCode.INTERNAL])

    def _stopped(self, run: Run) -> None:
        if run.beat.decide():
            run.tlog.info("stopped: the task was cancelled, expired or taken over by another run")
            self._discard(run)

    def _discard(self, run: Run, *, ended: bool = False) -> None:
        """Remove the run's result folder unless the task names it (workers.heartbeat.discard): called once the
        run's ending is decided, never before its compare-and-set."""
        discard(self.store, run.task.id, run.run_id, run.ctx.results, ended=ended)

    def _claim_lost(self, run: Run) -> bool:
        """Whether the task is no longer this run's (asked of Redis unless the context knows already)."""
        if run.ctx.cancelled:
            return True
        try:
            return self.store.report(run.task.id, run.run_id, None) != TaskStatus.PROCESSING
        except redis.RedisError:
            return False  # the usual path then records the failure as well as it can

    def _complete(self, run: Run, output: Any) -> RunEnd | None:
        task, ctx = run.task, run.ctx
        try:
            output = spill(ctx.results, task.id, output, self.config.inline_result_max)  # large JSON: a reference
            files_run = ctx.results.run_id if ctx.results.has_files(task.id) else None  # a resumed run's: the folder
        except StoreUnavailable as exc:
            return self._store_down(run, exc)
        except orjson.JSONEncodeError as exc:  # not JSON
            return self._unstorable(run, exc)
        if not run.beat.decide():
            return None  # put back after the stop grace meanwhile: the next run does it again
        try:
            finish = self.rq_finish() if self.rq_finish is not None else ()
            done = self.store.complete(task.id, run.run_id, output, items=ctx.item_counts, failures=ctx.failures,
                                       error_code=ctx.error_code, files_run=files_run, job=finish)
        except ResultNotStorable as exc:  # too large
            return self._unstorable(run, exc)
        self.rq_finished = bool(done and finish)
        if done:
            run.tlog.info("completed")
            return COMPLETED
        run.tlog.info("finished, but the task was cancelled, expired or taken over meanwhile: output dropped")
        self._discard(run)
        return None

    def _fail(self, run: Run, code: int, message: str) -> RunEnd | None:
        """FAILED with ``code``: the end to record in RQ, or None when the run no longer held the task."""
        if not run.beat.decide():
            return None
        done = self.store.fail(run.task.id, run.run_id, code, message, items=run.ctx.item_counts)
        self._discard(run, ended=done)
        if not done:
            return None
        run.tlog.info("failed with code %d: %s", code, message)
        return RunEnd(TaskStatus.FAILED, code, message)

    def _retry_or_fail(self, run: Run, code: int = ErrorCode.INTERNAL) -> RunEnd | None:
        """Another attempt when one is left: the task waits out its backoff in taskport's delayed set, queued
        by the scheduler's promote tick (app.core.deferred) when due, or is queued at once with no backoff."""
        task = run.task
        if task.attempts >= task.max_attempts:
            return self._fail(run, code, ERROR_MESSAGES[code])
        if not run.beat.decide():
            return None
        backoff = self.config.backoff
        delay = backoff[min(task.attempts - 1, len(backoff) - 1)]
        message = f"attempt {task.attempts} failed; retrying in {delay}s"
        job = retry_job_id(task.id, task.attempts)
        if delay:
            done = self.store.retry(task.id, run.run_id, message, run_at=now_ms() + delay * 1000, job_id=job)
        else:
            done = self.store.requeue(task.id, [F.MESSAGE, message, F.UPDATED_AT, now_ms()],
                                      self.jobs.requeue_commands(task, job), job, run_id=run.run_id,
                                      stat=STAT_RETRIED, refund=False)
        self._discard(run, ended=done)
        if not done:
            return None
        run.tlog.info("retrying in %ds", delay)
        return None
