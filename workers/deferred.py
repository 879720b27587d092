"""The scheduler's ticks for tasks that wait (app.core.deferred): every half second (workers.timers), queue
the tasks whose ``run_at`` has come, and release or fail (-6) the tasks that run after one that ended.

Any number of scheduler processes run these at once: each step is a compare-and-set (a promotion's ZREM
answers 1 to one of them; a release or a -6 acts only while the task still waits for that task), so a second
scheduler only adds availability. Everything lives in Redis: a restarted scheduler, or one on the new
primary after a failover, carries on from the sets.
"""

from __future__ import annotations

import logging

import redis

from app.core import deferred, processors
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.store import TaskStore
from workers import timers

log = logging.getLogger(__name__)
def promote(store: TaskStore, jobs: JobQueue) -> int:
    """Queue every task whose run_at has come (batched): how many were queued."""
    queued = deferred.promote_all_due(store, jobs, now_ms())
    if queued:
        log.debug("delayed: %d tasks queued", queued)
    return queued


def settle(store: TaskStore, jobs: JobQueue) -> dict[str, int]:
    """Release or fail the tasks that run after tasks that ended (a chain, several levels per tick)."""
    counts = deferred.settle_all(store, jobs, now_ms())
    if any(counts.values()):
        log.info("after: %d released, %d failed -6 (a task they depend on did not complete)",
                 counts["released"], counts["failed"])
    return counts


def ticks(conn: redis.Redis, config: Config) -> timers.Tick:
    """The tick over ``conn``: promote, then settle (with the processors loaded: a job's timeout is its
    processor's)."""
    processors.load(config.processor_modules)
    store, jobs = TaskStore(conn, config), JobQueue(conn, config)

    def tick() -> None:
        promote(store, jobs)
        settle(store, jobs)

    return tick


timers.TICKS.append(ticks)
