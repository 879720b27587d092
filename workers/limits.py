"""The scheduler's tick for concurrency limits (app.core.limits): every half second (workers.timers) it queues the
tasks released from limits' lines, and every ``SWEEP_EVERY`` seconds it sweeps every limit key, freeing the slots
of runs that died or stalled past the stall timeout so the line moves on (the recovery of a run frees its slot
in the same step already: this is the backstop).

Any number of scheduler processes run it at once: a queueing is one ZREM that answers 1 to one of them, and a
sweep only frees what is lapsed and releases into free slots.
"""

from __future__ import annotations

import logging
import time

import redis

from app.core import limits, processors
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.store import TaskStore
from workers import timers

log = logging.getLogger(__name__)


def ticks(conn: redis.Redis, config: Config) -> timers.Tick:
    """The tick over ``conn`` (with the processors loaded: a job's timeout is its processor's)."""
    processors.load(config.processor_modules)
    store, jobs = TaskStore(conn, config), JobQueue(conn, config)
    swept = [-limits.SWEEP_EVERY]

    def limit_tick() -> None:
        if time.monotonic() - swept[0] >= limits.SWEEP_EVERY:
            swept[0] = time.monotonic()
            released = limits.sweep(store, now_ms())
            if released:
                log.info("concurrency: %d parked task(s) released into slots freed by lapsed runs", released)
        queued = limits.queue_released(store, jobs)
        if queued:
            log.debug("concurrency: %d released task(s) queued", queued)

    return limit_tick


timers.TICKS.append(ticks)
