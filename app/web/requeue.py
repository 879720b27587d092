"""rq-dashboard's Requeue (one job, or all of a queue's failed jobs) on a taskport job: the task runs again
through the run-again path (:func:`app.web.rerun.run_again`), or the operator is told why not.

RQ's own requeue would put the job back on its queue, where the worker runs the task again too when it can
(workers.requeued: what ``rq requeue`` relies on), but would answer "OK" before knowing whether it can. So for a
job of ``workers.runner.run_task`` the task is run again here, when it is FAILED or CANCELLED (its stale job
leaves the failed registry: the task has a job of its own now), and otherwise the answer is a 409 problem
naming the task and its status (the job stays where it is). Any other job is RQ's to requeue, as before. The
dashboard's guards (credentials, POST only, same origin) run before these views, as before every dashboard view.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from flask import Flask, current_app, jsonify
from rq import Queue, requeue_job
from rq.exceptions import NoSuchJobError
from rq.job import Job

from app.core.clock import now_ms
from app.core.jobs import RUN_TASK
from app.core.logs import task_logger
from app.core.states import TaskStatus
from app.web.errors import AppError, Conflict, render
from app.web.rerun import run_again
from app.web.runtime import runtime

NO_STORE = {"Cache-Control": "no-store"}  # as rq-dashboard answers its own actions
log = logging.getLogger(__name__)


def wrap(app: Flask, blueprint: str) -> None:
    """Route the dashboard's requeue endpoints of ``app`` (views of ``blueprint``) through this module."""
    for name, handler in (("requeue_job_view", requeue_one), ("requeue_all", requeue_all)):
        endpoint = f"{blueprint}.{name}"
        view = app.view_functions[endpoint]
        app.view_functions[endpoint] = functools.wraps(view)(functools.partial(handler, view))


def requeue_one(view: Callable[..., Any], job_id: str) -> Any:
    """Requeue one job: a taskport job's task runs again (200 ``{"status": "OK", "task_id"}``) or is refused
    (409 problem+json saying why); any other job goes to rq-dashboard's own view."""
    job = _taskport_job(job_id)
    if job is None:
        return view(job_id=job_id)
    refused = _run_again(job)
    if refused is not None:
        return render(refused)
    return jsonify(status="OK", task_id=job.args[0], task_status=TaskStatus.PENDING), 200, NO_STORE


def requeue_all(view: Callable[..., Any], queue_name: str) -> Any:
    """Requeue every failed job of the queue: taskport jobs through the run-again path, others by RQ.
    ``count`` is how many went back; any refused taskport job is named, with why, under ``refused``."""
    conn = current_app.redis_conn  # type: ignore[attr-defined]
    registry = Queue(queue_name, connection=conn).failed_job_registry
    count, refused = 0, {}
    for job_id in registry.get_job_ids(cleanup=False):
        job = _taskport_job(job_id)
        if job is None:
            requeue_job(job_id, connection=conn)
            count += 1
        elif (why := _run_again(job)) is not None:
            refused[job_id] = why.detail
        else:
            count += 1
    body: dict[str, Any] = {"status": "OK", "count": count, **({"refused": refused} if refused else {})}
    return jsonify(body), 200, NO_STORE


def _taskport_job(job_id: str) -> Job | None:
    """The job if it is a delivery of a taskport task (its function is the runner's), else None."""
    try:
        job = Job.fetch(job_id, connection=current_app.redis_conn)  # type: ignore[attr-defined]
    except NoSuchJobError:
        return None
    return job if job.func_name == RUN_TASK and job.args else None


def _run_again(job: Job) -> AppError | None:
    """Run the job's task again (any member's: the operator's action); None when done, else why not. The
    stale job leaves the failed registry once the task is queued under a job of its own."""
    rt = runtime()
    task_id = str(job.args[0])
    task = rt.service.snapshot(task_id)
    if task is None:
        return Conflict(f"task {task_id} of this job is gone: nothing to requeue", task_status="")
    try:
        task = run_again(rt.service, rt.results, task)
    except AppError as exc:
        return Conflict(f"task {task_id} cannot run again: {exc.detail}", task_status=task.status,
                        help="a taskport job is requeued by running its task again (POST /api/v1/tasks/<id>/retry), "
                             "which only a FAILED or CANCELLED task can")
    if task.effective_status(now_ms()) == TaskStatus.EXPIRED:
        return Conflict(f"task {task_id} has EXPIRED: it cannot run again", task_status=TaskStatus.EXPIRED)
    registry = Queue(job.origin, connection=rt.redis).failed_job_registry
    if job.id in registry:  # a job elsewhere (a run still ending after a cancel) is left to its worker
        registry.remove(job, delete_job=True)
    task_logger(log, task_id).info("run again from rq-dashboard's Requeue of job %s", job.id)
    return None
