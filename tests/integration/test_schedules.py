"""Periodic schedules fired by real scheduler processes on a real Redis: two schedulers serve one fire time
with exactly one task, within 2 s of it, and move the schedule to the next minute; a scheduler killed across
a fire time leaves it to the next one started, which creates the one catch-up task. (Five minutes of
``* * * * *`` under two schedulers: test_schedules_slow.py.)

The schedule is created through the store and its next fire time set a second ahead directly in Redis, as
only a test may: so a test waits a second for a fire time, not up to a minute.
"""

from __future__ import annotations

import time

import redis

from app.core import keys
from app.core.clock import now_ms
from app.core.keys import ScheduleField
from app.core.schedules import Schedule, ScheduleStore, fire_digest
from tests.integration.harness import Stack, wait_until

EVERY_MINUTE = "* * * * *"
TASK = {"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1}, "priority": None}


def schedule(conn: redis.Redis, fire_ms: int) -> Schedule:
    """A ``* * * * *`` schedule of member public whose next fire time is ``fire_ms`` (set by hand)."""
    made = ScheduleStore(conn, 100).create("public", name="t", cron_expr=EVERY_MINUTE, timezone="UTC", task=TASK,
                                           paused=False, now=now_ms())
    with conn.pipeline() as pipe:
        pipe.hset(keys.schedule(made.id), ScheduleField.NEXT_RUN_AT, fire_ms)
        pipe.zadd(keys.SCHEDULES_DUE, {made.id: fire_ms})
        pipe.execute()
    return made


def tasks(conn: redis.Redis) -> list[str]:
    return [t.decode() for t in conn.zrange(keys.history("public"), 0, -1)]


def created_at(conn: redis.Redis, task_id: str) -> int:
    return int(conn.hget(keys.task(task_id), "created_at"))


def clear_of_a_minute_boundary() -> None:
    """Wait, if need be, until the next minute boundary (the schedules' next fire time, ``* * * * *``) is at least
    20 s away: a test that fires once and then counts one task would see the next minute's task too."""
    wait_until(lambda: now_ms() % 60_000 < 40_000, timeout=25, interval=0.2)


def test_two_schedulers_create_one_task_for_a_fire_time_and_move_to_the_next_minute(stack: Stack) -> None:
    clear_of_a_minute_boundary()
    stack.start_scheduler()
    stack.start_scheduler()
    conn = stack.redis()
    fire = now_ms() + 1000
    made = schedule(conn, fire)
    (task_id,) = wait_until(lambda: tasks(conn), timeout=10,
                            message=lambda: "the fire time's task\n" + stack.log_tails())
    time.sleep(1.5)  # three more rounds of each scheduler: none may add a task
    assert tasks(conn) == [task_id]
    assert 0 <= created_at(conn, task_id) - fire <= 2000  # within 2 s of its fire time
    after = ScheduleStore(conn, 100).get(made.id)
    assert after is not None and after.last_task_id == task_id
    assert after.next_run_at is not None and after.next_run_at % 60_000 == 0  # the next minute, after the task's
    assert fire < after.next_run_at <= created_at(conn, task_id) + 60_000
    assert conn.get(keys.dedup("public", fire_digest(made.id, fire))) == task_id.encode()
    assert conn.lrange("rq:queue:default", 0, -1) == [task_id.encode()]  # queued for a worker


def test_a_scheduler_killed_across_a_fire_time_leaves_one_catch_up_task_to_the_next(stack: Stack) -> None:
    clear_of_a_minute_boundary()
    victim = stack.start_scheduler()
    conn = stack.redis()
    fire = now_ms() + 1500
    made = schedule(conn, fire)
    stack.kill9(victim)
    wait_until(lambda: now_ms() > fire + 1500, timeout=5)  # the fire time passes with no scheduler
    assert tasks(conn) == []
    stack.start_scheduler()
    (task_id,) = wait_until(lambda: tasks(conn), timeout=10, message=lambda: "the catch-up task\n" + stack.log_tails())
    time.sleep(1.0)
    assert tasks(conn) == [task_id]
    assert conn.get(keys.dedup("public", fire_digest(made.id, fire))) == task_id.encode()  # the missed fire time's
    after = ScheduleStore(conn, 100).get(made.id)
    assert after is not None and after.next_run_at is not None and after.next_run_at > now_ms()
