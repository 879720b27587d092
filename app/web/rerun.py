"""Run a FAILED or CANCELLED task again: the steps of ``POST /api/v1/tasks/{id}/retry`` (the member's own
task) and of rq-dashboard's Requeue on a taskport job (an operator's, any member's task).

The state change itself is one compare-and-set (:func:`app.core.rerun.rerun`, through
:func:`app.core.rerun.run_again`, which a worker's delivery of a job ``rq requeue`` put back runs too); once it
has won, the folders the failed runs left are removed from the result store (a FAILED or CANCELLED task has no
result file to keep, and the new run would prune them anyway: a store that is down only logs a warning). Those
folders are listed before the compare-and-set, so the folder of the new run, which may start as soon as it is
queued, is never among them; a rerun that lost removes nothing. The job of the delivery that ended the task
leaves RQ's failed registry then: one failed entry per task, the newest. Nothing here knows about HTTP beyond
the typed errors of :mod:`app.web.errors`.
"""

from __future__ import annotations

import logging

from app.core.answers import ActiveCapReached
from app.core.clock import now_ms
from app.core.jobs import rerun_job_id
from app.core.logs import task_logger
from app.core.rerun import Rerun
from app.core.rerun import run_again as rerun_task
from app.core.results import ResultStore
from app.core.states import MISSING_PAYLOAD, RERUNNABLE, TaskStatus
from app.core.task import Task
from app.web.errors import AppError, Conflict, task_not_found
from app.web.service import TaskService, over_active_cap

log = logging.getLogger(__name__)


def run_again(service: TaskService, results: ResultStore, task: Task) -> Task:
    """Put ``task`` back to PENDING under its own id, queued now; returns it as written. A task that has
    EXPIRED is returned as it is (the caller answers 410 with its document). Raises Conflict when it is not
    FAILED or CANCELLED (or its payload is gone), NotFound when it vanished, TooManyRequests at the member's
    cap of unfinished tasks."""
    status = task.effective_status(now_ms())
    if status == TaskStatus.EXPIRED:
        return task
    if status not in RERUNNABLE:
        raise refusal(status)
    try:
        done = rerun_task(service.store, service.jobs, results, task)
    except ActiveCapReached as exc:
        raise over_active_cap(exc) from None
    if done.task is None:
        return _not_done(task, done)
    task_logger(log, task.id).info("run again (was %s, %d attempts so far) as job %s", status, task.attempts,
                                   rerun_job_id(task.id, task.seq))
    return done.task


def refusal(status: str, task_status: str | None = None) -> AppError:
    """The 409 for a task found in ``status``; for MISSING_PAYLOAD, a task (in ``task_status``) whose payload
    is no longer kept."""
    if status == MISSING_PAYLOAD:
        return Conflict("the task's payload is no longer kept (it ended before failed and cancelled tasks kept "
                        "theirs): submit it again instead", task_status=task_status)
    return Conflict(f"task is {status}; only FAILED or CANCELLED tasks can be run again", task_status=status)


def _not_done(task: Task, done: Rerun) -> Task:
    """What the script's refusal means: the task expired meanwhile (returned as it is), is gone, or moved."""
    if done.status == TaskStatus.EXPIRED:
        return task
    if not done.status:
        raise task_not_found()
    raise refusal(done.status, task.status)
