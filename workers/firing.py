"""Periodic schedules firing: a tick of the scheduler's half-second loop (workers.timers).

Each round reads the schedules whose next fire time has come (``keys.SCHEDULES_DUE``) and, for each:

1. creates its task with a dedup key derived from the schedule and that fire time
   (:func:`app.core.schedules.fire_digest`), so every scheduler process, a restarted one and one on a
   promoted replica all name the same key and the submit script creates the task once;
2. moves the schedule to its next fire time by compare-and-set (:meth:`ScheduleStore.advance`): only from
   the fire time it served, so a second scheduler that served it too (and met the dedup key) changes nothing.

The next fire time is the first one after *now*, not after the fire time served: fire times missed while no
scheduler ran collapse into the one catch-up task created for the earliest of them, never a burst.
"""

from __future__ import annotations

import logging

import redis

from app.core import cron, processors
from app.core.answers import ActiveCapReached, StoredBytesReached
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.schedules import Schedule, ScheduleStore, fire_digest
from app.core.store import TaskStore
from app.core.submit import create_task
from workers import timers

log = logging.getLogger(__name__)
BATCH = 100  # schedules served per round at most (the rest wait half a second)


class Firing:
    """What a round needs, built once per scheduler process over its connection."""

    def __init__(self, conn: redis.Redis, config: Config) -> None:
        processors.load(config.processor_modules)  # a task's queue, timeout and attempts are its processor's
        self.conn = conn
        self.schedules = ScheduleStore(conn, config.max_schedules, config.call_record_ms)
        self.store = TaskStore(conn, config)
        self.jobs = JobQueue(conn, config)

    def round(self, now: int | None = None) -> int:
        """Serve every schedule due at ``now`` (default: the clock); returns how many tasks it created."""
        now = now_ms() if now is None else now
        created = 0
        for schedule_id in self.schedules.due(now, BATCH):
            schedule = self.schedules.get(schedule_id)
            if schedule is None:
                self.schedules.forget(schedule_id)
            elif schedule.next_run_at is not None and schedule.next_run_at <= now and not schedule.paused:
                created += self.fire(schedule, schedule.next_run_at, now)
        return created

    def fire(self, schedule: Schedule, fire_ms: int, now: int) -> int:
        """Create the task of ``fire_ms`` (once, whoever else tries) and advance; 1 if this call created it."""
        task_id, created = self._create(schedule, fire_ms)
        try:
            next_ms: int | None = next_fire(schedule, now)
        except ValueError:  # cannot happen for an expression the API accepted; never loop on it
            next_ms = None
        self.schedules.advance(schedule.id, fire_ms, next_ms, now, task_id)
        return int(created)

    def _create(self, schedule: Schedule, fire_ms: int) -> tuple[str | None, bool]:
        task = schedule.task
        try:
            outcome = create_task(self.store, self.jobs, schedule.member, task["type"], task["payload"],
                                  fire_digest(schedule.id, fire_ms), task.get("priority"),
                                  callback=task.get("callback"))
        except KeyError:
            log.error("schedule %s: task type %r is not registered here (TASKPORT_PROCESSORS?): fire time skipped",
                      schedule.id, task["type"])
            return None, False
        except (ActiveCapReached, StoredBytesReached) as exc:
            log.warning("schedule %s: %s is at a quota (%s): fire time skipped", schedule.id, schedule.member, exc)
            return None, False
        if outcome.created:
            log.info("schedule %s fired: task %s", schedule.id, outcome.task_id)
        return outcome.task_id, outcome.created


def next_fire(schedule: Schedule, now: int) -> int:
    """The schedule's first fire time after ``now``: missed ones are not served one by one (see the module)."""
    return cron.next_fire(schedule.cron, schedule.timezone, now)


timers.TICKS.append(lambda conn, config: Firing(conn, config).round)
