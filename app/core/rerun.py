"""Run a FAILED or CANCELLED task again: the same task id back to PENDING, its RQ job queued, in one step.

The step is the RERUN script (app.core.scripts): one compare-and-set that resets the failed run's outcome,
starts the task's lifetime again and queues its job (the commands of
:meth:`app.core.jobs.JobQueue.requeue_commands`, replayed inside the script as a submit's are). The job gets
an id of its own (:func:`app.core.jobs.rerun_job_id`): the old delivery's job may still be in RQ's registries (failed,
or ending after a cancel), and RQ must not take one for the other. Dedup is not consulted: it is the same
task. Its payload is there because a FAILED or CANCELLED task keeps it until it expires
(``TaskStore._terminal``).

A batch's ``then`` task whose batch still runs is not queued: it goes back to waiting for the batch, which
releases it once when it ends (app.core.batchscripts), queued then under its own id.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple

from app.core import keys, lua, processors, scripts
from app.core.answers import ActiveCapReached
from app.core.clock import now_ms
from app.core.jobs import JobQueue, rerun_job_id
from app.core.keys import STAT_RERUN
from app.core.logs import task_logger
from app.core.lua import Command
from app.core.results import ResultStore, StoreUnavailable, remove_runs
from app.core.states import RERUNNABLE
from app.core.store import TaskStore
from app.core.task import Task

RERUN_MESSAGE = "queued to run again"
log = logging.getLogger(__name__)


class Rerun(NamedTuple):
    """What :func:`rerun` did: ``task`` as written when done; else None, and ``status`` is the status that
    prevented it ('' when the task is gone; EXPIRED past its time; MISSING_PAYLOAD when its payload is gone)."""

    status: str
    task: Task | None = None


def rerun(store: TaskStore, task_id: str, job_id: str, job: Sequence[Command], budget: int) -> Rerun:
    """FAILED|CANCELLED -> PENDING, queued as RQ job ``job_id`` (the commands ``job``), with ``budget`` runs
    for the new attempt (its processor's retries + 1). Raises ActiveCapReached, writing nothing, when the
    member holds ``Config.active_task_cap`` unfinished tasks already."""
    c = store.config
    t = now_ms()
    job_keys, job_args = lua.replay(job)
    answer = store.run_script(scripts.RERUN.name, *scripts.RERUN.call(
        keys={"task": keys.task(task_id), "payload": keys.payload(task_id), "result": keys.result(task_id),
              "checkpoint": keys.checkpoint(task_id), "cursor": keys.cursor(task_id), "output": keys.output(task_id),
              "expiry": keys.EXPIRY,
              "delayed": keys.DELAYED, "events": keys.events(task_id), "stats": keys.STATS, "active": keys.ACTIVE,
              "batch_head": keys.BATCH_HEAD, "stored_bytes": keys.STORED_BYTES, "waiting_tasks": keys.WAITING},
        args={"expected": ",".join(sorted(RERUNNABLE)), "task_id": task_id, "now_ms": t,
              "expiry_ms": t + c.task_ttl * 1000, "key_ttl_s": c.task_ttl + c.tombstone_ttl,
              "message": RERUN_MESSAGE, "budget": max(int(budget), 1), "job_id": job_id,
              "cap": c.active_task_cap, "stat": STAT_RERUN, "job_argc": len(job_args)},
        rest_keys=job_keys, rest=job_args, record_ms=c.call_record_ms,
    ), acknowledged=True)  # fmt: skip
    if answer[0] == 2:
        raise ActiveCapReached(c.active_task_cap, int(answer[1]))
    if answer[0] == 1:
        flat = answer[1]  # the hash as HGETALL answers in a script: field, value, ...
        task = Task.from_hash(dict(zip(flat[::2], flat[1::2], strict=True)), task_id)
        return Rerun(task.status, task)
    return Rerun(answer[1].decode())


def run_again(store: TaskStore, jobs: JobQueue, results: ResultStore, task: Task) -> Rerun:
    """The whole run-again of ``task`` (FAILED or CANCELLED), for every caller: ``POST .../retry``, rq-dashboard's
    Requeue (app.web.rerun) and a job RQ's own ``rq requeue`` put back (workers.requeued). It is queued as
    :func:`app.core.jobs.rerun_job_id`, with its processor's budget; once the compare-and-set won, the folders
    the failed runs left are removed (listed before it, so the new run's folder is never among them), and the
    job of the delivery that ended it leaves RQ's failed registry: one failed entry per task, the newest.
    Raises ActiveCapReached, writing nothing, at the member's cap of unfinished tasks."""
    earlier = earlier_runs(results, task.id)
    ended_job = store.job_id(task.id)  # read before the rerun records the new job in its place
    job_id = rerun_job_id(task.id, task.seq)
    proc = processors.get(task.type)
    done = rerun(store, task.id, job_id, jobs.requeue_commands(task, job_id), budget=proc.retries + 1 if proc else 1)
    if done.task is not None:
        remove_runs(results, task.id, earlier)
        jobs.forget_failed(task.priority, ended_job)
    return done


def earlier_runs(results: ResultStore, task_id: str) -> list[str]:
    """The runs of the task that have a folder now: the failed ones, to remove once the rerun won."""
    try:
        return results.runs(task_id)
    except StoreUnavailable as exc:
        task_logger(log, task_id).warning("could not remove the failed runs' files (the new run prunes them, or "
                                          "the orphan sweep): %s", exc)
        return []
