"""A worker taking over its slot from a dead predecessor (:func:`replace_predecessor`): the run it was making
recovered at once, the jobs it had claimed and not started given back, its registration removed from RQ.

Its own module because it runs once, before the worker registers (workers.worker.build_worker), and reaches
the task store and housekeeping's recovery, which nothing else of the worker classes needs.
"""

from __future__ import annotations

import logging
import time
from typing import cast
from uuid import uuid4

import redis
from rq import Queue
from rq import Worker as RQWorker
from rq.exceptions import NoSuchJobError
from rq.executions import Execution, ExecutionRegistry
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.registry import StartedJobRegistry
from rq.utils import as_text, utcparse
from rq.worker import BaseWorker

from app.core import keys, processors
from app.core.config import Config
from app.core.indexes import RunningIndex
from app.core.jobclaims import Claims
from app.core.jobs import JobQueue, task_of_job
from app.core.keys import TaskField as F
from app.core.logs import task_logger
from app.core.states import QUEUES, TaskStatus
from app.core.store import TaskStore, job_of
from workers.housekeeping import recover_now

log = logging.getLogger("workers.worker")  # the worker's log lines keep the logger name they always had
STOP_MARGIN = 2.0  # seconds past its stop grace a stopping predecessor may take to register its death


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
    executions = _runs_of(conn, predecessor)
    for execution in executions:
        _take_over_run(conn, config, predecessor, execution)
    predecessor.register_death()  # out of RQ's worker sets; its hash goes 60 s later, its executions index now
    if not executions:
        log.info("worker %s replaced its dead predecessor (pid %s), which was idle", name, predecessor.pid)


def give_back_claims(conn: redis.Redis, name: str) -> None:
    """The jobs a dead predecessor in slot ``name`` had taken and not started go back to the heads of their
    queues (app.core.jobclaims): after :func:`replace_predecessor`, so it is known dead."""
    back = Claims(conn).give_back(name)
    if back:
        log.warning("worker %s: %d job(s) its predecessor had taken but not started are back on their queues",
                    name, back)


def _runs_of(conn: redis.Redis, predecessor: BaseWorker) -> list[Execution]:
    """The runs ``predecessor`` was making: its execution records (a fork or spawn worker's, RQ's own), and the
    PROCESSING tasks of taskport's running index whose run it holds (the task's F.WORKER names it, written by
    START): the simple worker records no execution, no started registry entry and no started state in the job
    hash for a taskport job (workers.worker.StoppableSimpleWorker._recorded_start). Its slot's name is used by one
    live worker at a time and this one has not registered yet, so a task that names it is a run of a
    predecessor; whether that run is still the task's, recover_now decides. The running index holds the running
    tasks alone (a few per worker): one pipelined read, once per takeover."""
    runs = {execution.job_id: execution for execution in predecessor.get_current_executions(refresh=True)}
    task_ids = [as_text(member) for member in cast(list[bytes], conn.zrange(RunningIndex.key, 0, -1))]
    if not task_ids:
        return list(runs.values())
    with conn.pipeline(transaction=False) as pipe:
        for task_id in task_ids:
            pipe.hmget(keys.task(task_id), F.JOB, F.WORKER, F.STATUS)
        found = pipe.execute()
    for task_id, (job, worker, status) in zip(task_ids, found, strict=True):
        if worker and status and as_text(worker) == predecessor.name and as_text(status) == TaskStatus.PROCESSING:
            job_id = job_of(task_id, job)
            runs.setdefault(job_id, Execution(uuid4().hex, job_id, conn, worker_name=predecessor.name))
    return list(runs.values())


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
        elif job is not None and job.get_status(refresh=False) in (JobStatus.STARTED, JobStatus.QUEUED):
            # STARTED: a fork or spawn worker's run; QUEUED: a simple worker's, whose job hash was left as queued
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
