"""Housekeeping: expiry, recovery of tasks whose worker died, and monitoring.

Each pass is an RQ job that rq-scheduler enqueues on the ``housekeeping`` queue every interval under a
fixed id (see workers.scheduler). A pass takes a per-interval lock first, so two schedulers running at
once never run the same pass twice in one interval. Every pass reads an index by score in bounded
batches: its cost grows with the work to do, never with the number of live tasks.

Recovery has a second caller: a worker that starts in the place of a dead one (the same slot name)
recovers its predecessor's run at once with :func:`recover_now`, the same step without the stall timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import Retry
from rq.job import Job

from app.core import audit, keys, processors
from app.core.clock import iso, now_ms
from app.core.config import Config
from app.core.connection import connect
from app.core.history import Histories
from app.core.housekeeping_passes import QUEUE
from app.core.indexes import ExpiryIndex, FailureIndex, Locks, RunningIndex, SlowTasks
from app.core.jobclaims import Claims
from app.core.jobs import FAILED_JOB_TTL, JobQueue, resume_job_id
from app.core.logs import task_logger
from app.core.results import ResultStore, result_store
from app.core.states import TERMINAL, TaskStatus
from app.core.stats import Stats
from app.core.store import TaskStore
from app.core.task import Task
from workers import orphans

log = logging.getLogger(__name__)
BATCH = 500
RECONCILE_BATCHES = 20  # the reconciler looks at the oldest BATCH * RECONCILE_BATCHES tasks per pass
MAX_BATCHES = 200  # one pass handles at most BATCH * MAX_BATCHES due tasks; the next pass goes on
READINGS = frozenset({"failures_in_window"})  # counts a pass reports that are not work it did


@dataclass
class PassReport:
    name: str
    counts: dict[str, int] = field(default_factory=dict)
    skipped: bool = False

    def add(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    @property
    def actions(self) -> dict[str, int]:
        """What the pass changed (non-zero counts, minus the readings that change nothing)."""
        return {k: v for k, v in self.counts.items() if v and k not in READINGS}

    def log(self, seconds: float) -> None:
        """One INFO line when the pass did something, else DEBUG: an idle service stays quiet at INFO."""
        acted = self.actions
        text = ", ".join(f"{k}={v}" for k, v in sorted(acted.items())) if acted else "nothing to do"
        log.log(logging.INFO if acted else logging.DEBUG, "%s pass: %s in %.3f s", self.name, text, seconds)


class Housekeeper:
    def __init__(self, conn: redis.Redis, config: Config, results: ResultStore | None = None) -> None:
        self.config = config
        self.store = TaskStore(conn, config)
        self.jobs = JobQueue(conn, config)
        # the shared keys each pass reads, each with its owner (on the same connection)
        self.expiry = ExpiryIndex(conn)
        self.running = RunningIndex(conn)
        self.slow = SlowTasks(conn)
        self.failures = FailureIndex(conn)
        self.histories = Histories(self.store)
        self.locks = Locks(conn)
        self.stats = Stats(conn)
        self.results = results if results is not None else result_store(config)
        self.claims = Claims(conn)

    def locked(self, name: str, run: Callable[[PassReport], None]) -> PassReport:
        """Run a pass unless another copy already ran it in this interval (two schedulers, a restart)."""
        report = PassReport(name)
        interval_ms = int(self.config.housekeeping_interval * 1000)
        if not self.locks.take_pass(name, max(interval_ms * 9 // 10, 1)):
            report.skipped = True
            return report
        started = time.perf_counter()
        run(report)
        self.stats.count(keys.housekeeping_stat(name))
        report.log(time.perf_counter() - started)
        return report

    # -- expiry ---------------------------------------------------------------------------------
    def expire(self, report: PassReport, now: int | None = None) -> None:
        """Tombstone finished tasks past their result time, expire unfinished ones past the task TTL (-4)."""
        now = now if now is not None else now_ms()
        for _ in range(MAX_BATCHES):
            due = self.expiry.due(now, BATCH)
            if not due:
                break
            report.add("due", len(due))
            expired = self.store.expire_batch(due, now)
            self.jobs.remove(*(e.job for e in expired if e.previous == TaskStatus.PENDING))
            self.jobs.forget(*(e.job for e in expired if e.previous in TERMINAL))  # its end's record in RQ goes too
            for e in expired:
                self._after_expiry(e.task_id, e.previous, e.job)
                report.add(f"expired_{e.previous.lower()}")
            if len(due) < BATCH:
                break
        lifetime_ms = (self.config.task_ttl + self.config.result_ttl + self.config.tombstone_ttl) * 1000
        report.add("history_trimmed", self.histories.trim(now - lifetime_ms))
        self.jobs.trim_finished()
        audit.trim_by_age(self.store.redis, self.config.audit_limits[1], now)  # the scripts trim only by count
        report.add("orphans_removed", orphans.sweep(self.store, self.results))

    def _after_expiry(self, task_id: str, previous: str, job: str) -> None:
        tlog = task_logger(log, task_id)
        if previous == TaskStatus.PROCESSING:
            self.jobs.stop(job)
        self.results.delete(task_id)  # the result file, or what a stopped or lost run left behind
        tlog.info("expired (was %s)", previous)

    # -- crash recovery -------------------------------------------------------------------------
    def recover(self, report: PassReport, now: int | None = None) -> None:
        """PROCESSING tasks whose heartbeat is older than the stall timeout: re-queue or fail with -3."""
        cutoff = (now if now is not None else now_ms()) - int(self.config.stall_timeout * 1000)
        due = self.running.due(cutoff, BATCH)
        for task_id, task in zip(due, self.store.get_many(due), strict=True):
            if task is None or task.status != TaskStatus.PROCESSING:
                self.store.forget_run(task_id)  # only if it is still not running: a start may have come since
                continue
            outcome = recover_run(self.store, self.jobs, task, cutoff)
            if outcome:
                report.add(f"recovered_to_{outcome.lower()}")
                task_logger(log, task_id).warning(
                    "worker lost (no heartbeat for %.0f s, attempt %d of %d): now %s",
                    self.config.stall_timeout, task.attempts, task.max_attempts, outcome)

    # -- claims and the reconciler (app.core.jobclaims) --------------------------------------------
    def reclaim(self, report: PassReport, now: int | None = None) -> None:
        """The jobs taken and not started by workers whose RQ registration lapsed, back on their queues."""
        for worker, n in self.claims.give_back_lapsed().items():
            report.add("claims_returned", n)
            log.warning("worker %s is gone: %d job(s) it had taken but not started are back on their queues",
                        worker, n)

    def reconcile(self, report: PassReport, now: int | None = None) -> None:
        """The last line of defence: a PENDING task whose job is nowhere (no queue, claim list, RQ scheduled
        or started registry, not in keys.DELAYED, not waiting on a task) for ``unqueued_bound`` s is queued
        again, logged once and counted (``keys.STAT_RECONCILED``: it should stay 0). The candidates are the
        oldest tasks (keys.EXPIRY) created at least the bound ago, RECONCILE_BATCHES * BATCH per pass; a
        queued one sits near its queue's head, so its lookup is short."""
        now = now if now is not None else now_ms()
        bound_ms = int(self.config.unqueued_bound * 1000)
        created_before = now + self.config.task_ttl * 1000 - bound_ms  # an unfinished task's score: its expiry
        due = self.expiry.due(created_before, BATCH * RECONCILE_BATCHES)
        for start in range(0, len(due), BATCH):
            chunk = [t for t in self.store.get_many(due[start:start + BATCH]) if t and t.status == TaskStatus.PENDING]
            pipe = self.store.redis.pipeline(transaction=False)
            for task in chunk:
                job = self.store.job_id(task.id)
                self.claims.reconcile(task.id, self.jobs.requeue_commands(task, job), now, bound_ms, client=pipe)
            for task, answer in zip(chunk, pipe.execute(), strict=True):
                if answer[0] == 1:
                    report.add("unqueued_seen")
                elif answer[0] == 2:
                    report.add("reconciled")
                    task_logger(log, task.id).error(
                        "reconciled: PENDING with no job anywhere for %.0f s or more; queued again",
                        self.config.unqueued_bound)

    # -- monitoring -----------------------------------------------------------------------------
    def monitor(self, report: PassReport, now: int | None = None) -> None:
        """Log slow tasks once each; alert when failures within the window reach the threshold."""
        now = now if now is not None else now_ms()
        self._slow_tasks(report, now)
        self._failure_alert(report, now)

    def _slow_tasks(self, report: PassReport, now: int) -> None:
        running = self.running.ids()
        warned = self.slow.warned()
        gone = warned - set(running)
        if gone:
            self.slow.unmark(*gone)
        threshold = now - int(self.config.slow_task_warn * 1000)
        candidates = [t for t in running if t not in warned]
        for task in self.store.get_many(candidates):
            if task and task.status == TaskStatus.PROCESSING and task.started_at and task.started_at < threshold:
                age = (now - task.started_at) / 1000
                task_logger(log, task.id).warning("slow task: %s PROCESSING for %.0f s", task.type, age)
                self.slow.mark(task.id)
                report.add("slow_warned")

    def _failure_alert(self, report: PassReport, now: int) -> None:
        c = self.config
        window_start = now - c.alert_window * 1000
        failures = self.failures.since(window_start)
        report.add("failures_in_window", failures)
        if failures < c.alert_failures or not self.locks.take_alert(c.alert_window * 1000, now):
            return
        alert = {"alert": "task failures", "failures": failures, "window_seconds": c.alert_window,
                 "threshold": c.alert_failures, "at": iso(now)}
        log.error("ALERT: %d task failures in the last %d s (threshold %d)", failures, c.alert_window, c.alert_failures)
        report.add("alerts")
        if c.alert_webhook:
            self.jobs.enqueue_call(
                QUEUE, "workers.alerts.post_alert", c.alert_webhook, alert, retry=Retry(max=3, interval=[2, 10, 30]),
                job_timeout=30, result_ttl=0, failure_ttl=86400)


def recover_run(store: TaskStore, jobs: JobQueue, task: Task, stale_before_ms: int) -> str | None:
    """Take the run of PROCESSING ``task`` if its last heartbeat is older than ``stale_before_ms``: re-queued
    without using an attempt (from its checkpoint when it advanced) up to the bound of lost runs without
    progress, else FAILED -3 (TaskStore.recover). Returns the new status, or
    None when the run was not taken (it beat meanwhile, or the task moved on)."""
    # a job id of its own: the stalled delivery's job, once its work horse ends, is deleted by RQ
    # (result_ttl 0), and must not take the re-queued one with it
    job = resume_job_id(task.id, task.seq)
    lost = store.job_id(task.id)
    outcome = store.recover(task, stale_before_ms, jobs.requeue_commands(task, job), job_id=job)
    if outcome:
        # the lost run's job hash has no TTL (and says QUEUED: the simple worker writes no started state, nor a
        # started registry entry whose clean-up would file it as abandoned: workers.worker.StoppableSimpleWorker.
        # _recorded_start), so it expires as a failed job would (a worker that was only slow and ends it later
        # keeps the TTL: HSET does)
        store.redis.expire(Job.key_for(lost), FAILED_JOB_TTL)
    return outcome


def recover_now(store: TaskStore, jobs: JobQueue, task_id: str, job_id: str) -> tuple[Task, str] | None:
    """Recover at once the run of ``task_id`` that RQ job ``job_id`` was making, known to be lost: its worker
    died (the worker that took its place says so, workers.takeover), so there is no stall timeout to wait
    out. Only while the task is PROCESSING under that job: a run that was put back, taken over or finished
    is left alone. Returns the task as it was and its new status, or None when nothing was recovered."""
    task = store.get(task_id)
    if task is None or task.status != TaskStatus.PROCESSING or store.job_id(task_id) != job_id:
        return None
    outcome = recover_run(store, jobs, task, now_ms() + 1)  # any heartbeat is older than now + 1
    return (task, outcome) if outcome else None


# -- RQ entry points (what rq-scheduler enqueues) ------------------------------------------------
_housekeeper: Housekeeper | None = None


def housekeeper() -> Housekeeper:
    global _housekeeper
    if _housekeeper is None:
        config = Config.from_env()
        processors.load(config.processor_modules)
        _housekeeper = Housekeeper(connect(config), config)
    return _housekeeper


def expire_pass() -> dict[str, Any]:
    return housekeeper().locked("expire", housekeeper().expire).counts


def recover_pass() -> dict[str, Any]:
    hk = housekeeper()
    counts = hk.locked("recover", hk.recover).counts
    return {**counts, **hk.locked("reclaim", hk.reclaim).counts, **hk.locked("reconcile", hk.reconcile).counts}


def monitor_pass() -> dict[str, Any]:
    return housekeeper().locked("monitor", housekeeper().monitor).counts
