"""Tasks that wait before they are queued: for their ``run_at`` (``keys.DELAYED``) or for the tasks they run
after (``after``: ``keys.dependents`` and ``keys.SETTLED``). What the scheduler's ticks do with them
(workers.deferred), each step one compare-and-set script of app.core.waitscripts or the store's transition.

A due task's RQ job is built here, from the task (its type's timeout, its priority, its delayed_job_id), and
replayed by the script that takes the task out of the set, so a task is queued once however many schedulers
run. The news that a task ended reaches the tasks that run after it through ``keys.SETTLED``: the transition
script pushes the task's id there when it has dependents; :func:`settle` releases each dependent (COMPLETED)
or fails it -6 (anything else), and that failure, a transition like any other, pushes the dependent in turn:
a chain is decided one level per round (:data:`ROUNDS` rounds per tick).
"""

from __future__ import annotations

from typing import Any

from app.core import keys, lua
from app.core.jobs import JobQueue, delayed_job_id
from app.core.states import ACTIVE, TaskStatus
from app.core.store import TaskStore
from app.core.waitscripts import PROMOTE, RELEASE, SETTLE_DONE

BATCH = 500  # tasks per round trip
ROUNDS = 20  # settle rounds per tick: a chain this deep is decided within one tick


def promote_due(store: TaskStore, jobs: JobQueue, now: int, limit: int = BATCH) -> tuple[int, int]:
    """Queue up to ``limit`` tasks of keys.DELAYED whose run_at is at most ``now`` (ms): (how many were due,
    how many were queued; a task another scheduler queued first, or no longer PENDING, is not queued)."""
    due = [m.decode() for m in store.redis.zrangebyscore(keys.DELAYED, "-inf", now, start=0, num=limit)]
    if not due:
        return 0, 0
    pipe = store.redis.pipeline(transaction=False)
    for task_id, task in zip(due, store.get_many(due), strict=True):
        commands = jobs.requeue_commands(task, delayed_job_id(task)) if task is not None else []
        job_keys, job_args = lua.replay(commands)
        store.run_script(PROMOTE.name, *PROMOTE.call(
            keys={"task": keys.task(task_id), "delayed": keys.DELAYED},
            args={"task_id": task_id, "now_ms": now, "job_argc": len(job_args)},
            rest_keys=job_keys, rest=job_args, record_ms=store.config.call_record_ms), client=pipe)
    return len(due), sum(1 for answer in pipe.execute() if answer[0] == 1)


def promote_all_due(store: TaskStore, jobs: JobQueue, now: int, batches: int = 200) -> int:
    """:func:`promote_due` batch after batch while a batch comes back full (at most ``batches``): how many
    were queued."""
    queued = 0
    for _ in range(batches):
        seen, done = promote_due(store, jobs, now)
        queued += done
        if seen < BATCH:
            break
    return queued


def settle(store: TaskStore, jobs: JobQueue, now: int, limit: int = BATCH) -> dict[str, int]:
    """Act on up to ``limit`` entries of keys.SETTLED, oldest first: each dependent of the ended task is
    released (it COMPLETED) or failed -6; returns the counts ``released`` and ``failed``."""
    counts = {"released": 0, "failed": 0}
    for raw in reversed(store.redis.lrange(keys.SETTLED, -limit, -1)):
        dep_id = raw.decode()
        dep = store.get(dep_id)
        status = dep.status if dep is not None else TaskStatus.EXPIRED
        if status not in ACTIVE:
            waiting = sorted(m.decode() for m in store.redis.smembers(keys.dependents(dep_id)))
            for task_id, task in zip(waiting, store.get_many(waiting), strict=True):
                if status == TaskStatus.COMPLETED:
                    counts["released"] += _release(store, jobs, task_id, task, dep_id, now)
                else:
                    counts["failed"] += store.fail_waiting(task_id, dep_id)
                    store.redis.srem(keys.dependents(dep_id), task_id)
        store.run_script(SETTLE_DONE.name, *SETTLE_DONE.call(
            keys={"settled": keys.SETTLED, "dependents": keys.dependents(dep_id), "dep": keys.task(dep_id)},
            args={"dep_id": dep_id}, record_ms=store.config.call_record_ms))
    return counts


def settle_all(store: TaskStore, jobs: JobQueue, now: int, rounds: int = ROUNDS) -> dict[str, int]:
    """:func:`settle` round after round while keys.SETTLED holds entries (at most ``rounds``): a chain's
    failure goes one level down per round."""
    total = {"released": 0, "failed": 0}
    for _ in range(rounds):
        if not store.redis.llen(keys.SETTLED):
            break
        for what, n in settle(store, jobs, now).items():
            total[what] += n
    return total


def _release(store: TaskStore, jobs: JobQueue, task_id: str, task: Any, dep_id: str, now: int) -> int:
    """Count ``dep_id`` done for ``task_id`` (RELEASE): 1 when it counted."""
    commands = jobs.requeue_commands(task, task_id) if task is not None else []
    job_keys, job_args = lua.replay(commands)
    answer = store.run_script(RELEASE.name, *RELEASE.call(
        keys={"task": keys.task(task_id), "dependents": keys.dependents(dep_id), "delayed": keys.DELAYED,
              "events": keys.events(task_id), "waiting_tasks": keys.WAITING},
        args={"task_id": task_id, "dep_id": dep_id, "now_ms": now, "job_argc": len(job_args)},
        rest_keys=job_keys, rest=job_args, record_ms=store.config.call_record_ms))
    return 1 if answer[0] == 1 else 0
