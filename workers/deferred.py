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
_parts: dict[int, tuple[TaskStore, JobQueue]] = {}


def _for(conn: redis.Redis, config: Config) -> tuple[TaskStore, JobQueue]:
    """The store and job queue of the timers' connection, made once (with the processors loaded: a job's
    timeout is its processor's)."""
    found = _parts.get(id(conn))
    if found is None:
        processors.load(config.processor_modules)
        found = _parts[id(conn)] = (TaskStore(conn, config), JobQueue(conn, config))
    return found


def promote_tick(conn: redis.Redis, config: Config) -> int:
    """Queue every task whose run_at has come (batched): how many were queued."""
    store, jobs = _for(conn, config)
    queued = deferred.promote_all_due(store, jobs, now_ms())
    if queued:
        log.debug("delayed: %d tasks queued", queued)
    return queued


def settle_tick(conn: redis.Redis, config: Config) -> dict[str, int]:
    """Release or fail the tasks that run after tasks that ended (a chain, several levels per tick)."""
    store, jobs = _for(conn, config)
    counts = deferred.settle_all(store, jobs, now_ms())
    if any(counts.values()):
        log.info("after: %d released, %d failed -6 (a task they depend on did not complete)",
                 counts["released"], counts["failed"])
    return counts


timers.TICKS += [promote_tick, settle_tick]
