"""A delivery of a job that RQ's own tools put back from its failed registry (``rq requeue <id>``, ``rq requeue
--all``, ``Job.requeue``): the operator asked for the task to run again, as rq-dashboard's Requeue does
(app.web.requeue), and it runs again through the same path (:func:`app.core.rerun.run_again`).

RQ's CLI takes the job out of the failed registry and queues it as it was; the task it names is FAILED (or
CANCELLED), so its start finds the task ended. Such a delivery is told apart from any other one that finds its
task ended by RQ's failure record of that very job (its latest result is a failure): only a job that was filed
as failed and put back is delivered again with one. The run again is the RERUN compare-and-set (a call record
makes it safe sent twice; a second delivery finds the task no longer FAILED), queued under a job of its own; this
delivery then ends and RQ deletes its job. When the task cannot run again (it is running or done already, has
expired, its payload is gone, or its member is at the cap of unfinished tasks), the job goes back to the failed
registry with why as its failure text, so the operator reads the refusal there and the failed list keeps it.
"""

from __future__ import annotations

import logging

from rq.job import Job
from rq.results import Result

from app.core.answers import ActiveCapReached
from app.core.clock import now_ms
from app.core.jobs import JobQueue
from app.core.rerun import run_again
from app.core.results import ResultStore
from app.core.states import MISSING_PAYLOAD, RERUNNABLE, TaskStatus
from app.core.store import TaskStore

HOW = "a requeue runs a FAILED or CANCELLED task again (as POST /api/v1/tasks/<id>/retry)"


def requeued_from_failed(job: Job | None) -> bool:
    """Whether ``job`` is being delivered again after RQ filed it as failed (one read: its latest result)."""
    if job is None:
        return False
    latest = job.latest_result()
    return latest is not None and latest.type == Result.Type.FAILED


def run_requeued(store: TaskStore, jobs: JobQueue, results: ResultStore, task_id: str, found: str,
                 job_id: str, tlog: logging.LoggerAdapter) -> str | None:
    """Run the task again for the requeued job ``job_id`` whose start found it ``found``: None when it is queued
    to run again, else why not (the failure text the job is filed back with)."""
    task = store.get(task_id) if found in RERUNNABLE else None
    why = f"task is {found or 'gone'}; {HOW}"
    if task is not None and task.effective_status(now_ms()) == TaskStatus.EXPIRED:
        why = f"task has EXPIRED; {HOW}"
    elif task is not None:
        try:
            done = run_again(store, jobs, results, task)
        except ActiveCapReached as exc:
            done, why = None, f"its member holds {exc.active} unfinished tasks, at the cap of {exc.cap}: requeue later"
        if done is not None and done.task is not None:
            tlog.info("run again from RQ's requeue of job %s (was %s, %d attempts so far)", job_id, found,
                      task.attempts)
            return None
        if done is not None:
            why = ("the task's payload is no longer kept: submit it again" if done.status == MISSING_PAYLOAD
                   else f"task is {done.status or 'gone'}; {HOW}")
    tlog.warning("requeue of job %s refused, kept in the failed registry: %s", job_id, why)
    return why
