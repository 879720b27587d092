"""A tour of every write script: each task, batch, wait, callback and schedule script called at least once,
through the stores' own methods, on whatever client the store was built on.

``tests/unit/test_scripts.py`` runs it on fakeredis to check the keys every script is passed; the reply-loss
test (``tests/integration/test_twice.py``) runs it on a real server with every script call sent twice.
"""

from __future__ import annotations

import uuid
from typing import Any

from app.core import deferred, keys, limits, waitscripts
from app.core.answers import NewTask
from app.core.batches import BatchStore, BatchTask
from app.core.callbacks import Deliveries, DeliveryId
from app.core.clock import now_ms
from app.core.jobs import JobQueue, rerun_job_id
from app.core.output import OutputLog, encode
from app.core.rerun import rerun
from app.core.schedules import ScheduleStore
from app.core.store import TaskStore


def new_task(member: str = "public") -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member=member, type="demo.sleep", payload={"seconds": 0}, dedup_digest=task_id,
                   priority="default", max_attempts=2)


def tour(store: TaskStore, jobs: JobQueue, conn: Any) -> None:
    """Every write script, at least once, each in a state where it writes."""
    done, failed, cancelled, lost = new_task(), new_task(), new_task(), new_task()
    for t in (failed, cancelled, lost):
        store.create(t, jobs.job_commands(t.task_id, t.priority, 60))
    store.create(done, jobs.first_job(done.task_id, done.priority, 60, done.member))  # a submit's: the template's
    store.create(done)  # a duplicate: the same keys, the holder's hash read in the script
    assert store.start(done.task_id, "r1").started is not None
    store.report(done.task_id, "r1", 50, "half", {"total": 2, "succeeded": 1, "failed": 0},
                 checkpoint=b'{"done": 1}', cursor=b'"c1"')
    store.report(done.task_id, "r1", None)
    output = OutputLog(store)  # a run's output lines (app.core.output), the list trimmed at its cap
    assert output.emit(done.task_id, "r1", [encode(now_ms(), "one"), encode(now_ms(), "two")], now_ms()) == "PROCESSING"
    store.complete(done.task_id, "r1", {"big": "x" * 100}, items=None, failures=[], error_code=None)
    store.start(failed.task_id, "r2")
    store.retry(failed.task_id, "r2", "again")
    store.start(failed.task_id, "r3")
    store.fail(failed.task_id, "r3", 7, "no")
    store.cancel(cancelled.task_id)
    again = rerun_job_id(cancelled.task_id, 0)
    rerun(store, cancelled.task_id, again, jobs.job_commands(cancelled.task_id, "default", 60, again), 1)
    store.start(lost.task_id, "r5")  # a lost run recovered (a MULTI with its job), then a stop's put-back
    found = store.get(lost.task_id)
    assert found is not None
    assert store.recover(found, now_ms() + 1, jobs.requeue_commands(found, lost.task_id), lost.task_id)
    store.start(lost.task_id, "r6")
    store.interrupted(lost.task_id, "r6", "stopping", jobs.requeue_commands(found, lost.task_id), lost.task_id)
    later, waiter, follower = new_task(), new_task(), new_task()  # run_at and after (app.core.deferred)
    store.create(later, run_at=now_ms() + 60_000)
    store.create(waiter, after=[done.task_id, failed.task_id])  # failed: FAILED -6 at once
    store.create(follower, jobs.job_commands(follower.task_id, "default", 60), after=[later.task_id])
    store.run_script(waitscripts.PROMOTE.name, *waitscripts.PROMOTE.call(
        keys={"task": keys.task(later.task_id), "delayed": keys.DELAYED},
        args={"task_id": later.task_id, "now_ms": now_ms() + 61_000, "job_argc": 0},
        record_ms=store.config.call_record_ms))
    store.start(later.task_id, "r4")
    store.complete(later.task_id, "r4", 1, items=None, failures=[], error_code=None)
    assert deferred.settle_all(store, jobs, now_ms()) == {"released": 1, "failed": 0}
    batch_id = str(uuid.uuid4())  # a batch: its then task, a duplicate, its tasks' batch keys (built in Lua)
    one, then = new_task(), new_task()
    one = NewTask(**{**one.__dict__, "batch": batch_id})
    then = NewTask(**{**then.__dict__, "then_of": batch_id})
    BatchStore(store).create(batch_id, "public", [BatchTask(one, jobs.job_commands(one.task_id, "default", 60,
                                                                                   member="public")),  # in line
                                                  BatchTask(NewTask(**{**one.__dict__, "task_id": str(uuid.uuid4())}))],
                             BatchTask(then), "https://example.com/hook")
    store.cancel(one.task_id)  # the batch done: its then released, its callback due
    assert deferred.promote_all_due(store, jobs, now_ms() + 1) >= 1  # the then task queued
    deliveries = Deliveries(conn, store.config.call_record_ms)  # the batch's callback: claimed, taken, settled
    claimed, lease = deliveries.claim(now_ms() + 1, 10)
    assert claimed
    did = DeliveryId.parse(claimed[0])
    assert did is not None and deliveries.take(claimed[0], lease, lease + 1000)
    deliveries.settle(did, "retrying", 1, 500, now_ms() + 60_000)
    deliveries.settle(did, "delivered", 2, 200, None)
    schedules = ScheduleStore(conn, 10, store.config.call_record_ms)
    t = now_ms()
    made = schedules.create("public", name="nightly", cron_expr="0 3 * * *", timezone="UTC",
                            task={"type": "demo.sleep", "payload": {"seconds": 0}}, paused=False, now=t)
    assert made.next_run_at is not None
    assert schedules.update(made, {"paused": True}, t) is not None
    unpaused = schedules.update(made, {"paused": False}, t)
    assert unpaused is not None and unpaused.next_run_at is not None
    assert schedules.advance(made.id, unpaused.next_run_at, unpaused.next_run_at + 86_400_000, t, done.task_id)
    conn.zadd(keys.RUNNING, {done.task_id: 1})  # an entry the recovery pass finds for a task that ended
    assert store.forget_run(done.task_id)
    expired = store.expire_batch([done.task_id, waiter.task_id], now_ms())  # housekeeping's pipeline of transitions
    assert {e.task_id for e in expired} == {done.task_id, waiter.task_id}
    limited_tour(store, jobs, conn)


def limited_tour(store: TaskStore, jobs: JobQueue, conn: Any) -> None:
    """Concurrency limits (a slot taken, a task parked, released by an end, queued, a lapsed slot swept) and a rate
    limit's tokens (taken, refused): app.core.limits."""
    from workers.exceptions import RateDeferred
    from workers.ratelimit import RateLimiter

    spec = "demo.sleep=1/member"
    first, second, third = (new_task("limited") for _ in range(3))
    for t in (first, second, third):
        store.create(t, jobs.job_commands(t.task_id, t.priority, 60))
    assert store.start(first.task_id, "l1", spec).started is not None
    assert store.start(second.task_id, "l2", spec).parked
    store.complete(first.task_id, "l1", 1, items=None, failures=[], error_code=None)  # second released
    assert limits.queue_one(store, jobs, second.task_id, store.get(second.task_id))[0] == 1
    assert store.start(second.task_id, "l3", spec).started is not None
    assert store.start(third.task_id, "l4", spec).parked
    conn.zadd(keys.RUNNING, {second.task_id: 1})  # its worker died: the sweep frees its slot for third
    assert limits.sweep_one(store, "demo.sleep member limited", now_ms())[0] == 1
    take = RateLimiter(store, store.config, first.task_id)
    assert take.take("tour", 1, 60) == 0
    try:
        take.take("tour", 1, 60)
        raise AssertionError("a second token of 1 a minute was given at once")
    except RateDeferred:
        pass
