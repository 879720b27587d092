"""Batches in the store (fakeredis with Lua): the create script, the counters every transition keeps, the
then task released once, the callback scheduled once, and duplicates counted where they are."""

from __future__ import annotations

import uuid

import pytest

from app.core import deferred, keys, lines
from app.core.answers import ActiveCapReached, NewTask, StoredBytesReached
from app.core.batches import DONE, RUNNING, BatchStore, BatchTask
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import JobQueue, rerun_job_id
from app.core.rerun import rerun
from app.core.states import TaskStatus
from app.core.store import TaskStore


def new(batch_id: str, *, dedup: str | None = None, then: bool = False, callback: str = "") -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member="public", type="demo.sleep", payload={"seconds": 0},
                   dedup_digest=dedup or task_id, priority="default", max_attempts=1,
                   batch="" if then else batch_id, then_of=batch_id if then else "",
                   callback_url=callback, callback_events=("COMPLETED", "FAILED") if callback else ())


@pytest.fixture
def batches(store: TaskStore) -> BatchStore:
    return BatchStore(store)


def make(batches: BatchStore, n: int, *, then: bool = True, callback: str = "", jobs: JobQueue | None = None,
         dedups: list[str | None] | None = None):
    batch_id = str(uuid.uuid4())
    tasks = []
    for i in range(n):
        t = new(batch_id, dedup=(dedups or [None] * n)[i])
        tasks.append(BatchTask(t, jobs.job_commands(t.task_id, "default", 60) if jobs else ()))
    then_task = BatchTask(new(batch_id, then=True)) if then else None
    return batches.create(batch_id, "public", tasks, then_task, callback)


def run(store: TaskStore, task_id: str, *, ok: bool = True, items: dict | None = None) -> None:
    run_id = f"run-{task_id}"
    assert store.start(task_id, run_id).started is not None
    if ok:
        assert store.complete(task_id, run_id, {"ok": 1}, items=items, failures=[], error_code=None)
    else:
        assert store.fail(task_id, run_id, 7, "no", items=items)


def test_a_batch_is_created_with_its_tasks_queued_and_its_then_waiting(conn, store, batches, config) -> None:
    jobs = JobQueue(conn, config)
    created = make(batches, 3, jobs=jobs)
    b = created.batch
    assert (b.size, b.status, b.counts[TaskStatus.PENDING], b.progress) == (3, RUNNING, 3, 0)
    assert [e.duplicate for e in created.entries] == [False] * 3
    assert conn.llen("rq:queue:default") == 3  # the then task is not queued
    then = store.get(b.then_task_id)
    assert then.status == TaskStatus.PENDING and then.waiting_for == (b.id,) and then.batch_id == b.id
    assert store.get(created.entries[0].task_id).batch_id == b.id
    assert batches.task_ids(b.id) == [e.task_id for e in created.entries]


def test_counts_progress_and_items_follow_every_transition(store, batches) -> None:
    created = make(batches, 2)
    first, second = (e.task_id for e in created.entries)
    store.start(first, "r1")
    store.report(first, "r1", 50, "half", {"total": 4, "succeeded": 2, "failed": 0})
    b = batches.get(created.batch.id)
    assert b.counts[TaskStatus.PROCESSING] == 1 and b.progress == 25
    assert b.items == {"total": 4, "succeeded": 2, "failed": 0}
    store.complete(first, "r1", None, items={"total": 4, "succeeded": 3, "failed": 1}, failures=[], error_code=None)
    b = batches.get(created.batch.id)
    assert (b.counts[TaskStatus.COMPLETED], b.progress, b.status) == (1, 50, RUNNING)
    assert b.items == {"total": 4, "succeeded": 3, "failed": 1}
    run(store, second, ok=False)
    b = batches.get(created.batch.id)
    assert (b.counts[TaskStatus.FAILED], b.progress, b.status) == (1, 100, DONE)
    assert b.completed_at is not None


def test_the_then_task_is_released_once_when_the_last_task_ends(conn, store, batches) -> None:
    created = make(batches, 2)
    first, second = (e.task_id for e in created.entries)
    run(store, first)
    assert conn.zscore(keys.DELAYED, created.batch.then_task_id) is None
    store.cancel(second)
    assert conn.zscore(keys.DELAYED, created.batch.then_task_id) is not None
    then = store.get(created.batch.then_task_id)
    assert then.waiting_for == () and then.status == TaskStatus.PENDING
    conn.zrem(keys.DELAYED, created.batch.then_task_id)  # as the promote tick does
    jobs = JobQueue(conn, Config())
    rerun(store, second, "again", jobs.job_commands(second, "default", 60, "again"), 1)  # the batch reopens
    assert batches.get(created.batch.id).status == RUNNING
    run(store, second)
    assert batches.get(created.batch.id).status == DONE
    assert conn.zscore(keys.DELAYED, created.batch.then_task_id) is None  # released once, not again


def test_the_batch_callback_is_due_once_and_a_task_callback_per_listed_event(conn, store, batches) -> None:
    created = make(batches, 1, then=False, callback="https://example.com/hook")
    assert batches.get(created.batch.id).callback == {"state": "pending", "attempts": 0, "last_status": None}
    run(store, created.entries[0].task_id)
    due = [m.decode() for m in conn.zrange(keys.CALLBACKS_DUE, 0, -1)]
    assert due == [f"b:{created.batch.id}:0:DONE"]
    batch_id = str(uuid.uuid4())
    t = new(batch_id, callback="https://example.com/t")
    store.create(t)
    store.cancel(t.task_id)  # CANCELLED is not among its events
    assert conn.zcard(keys.CALLBACKS_DUE) == 1
    t2 = new(batch_id, callback="https://example.com/t")
    store.create(t2)
    run(store, t2.task_id)
    seq = store.get(t2.task_id).seq
    assert f"t:{t2.task_id}:{seq}:COMPLETED".encode() in conn.zrange(keys.CALLBACKS_DUE, 0, -1)
    assert store.get(t2.task_id).callback == {"state": "pending", "attempts": 0, "last_status": None}


def test_a_duplicate_is_referenced_and_counted_at_its_status(store, batches) -> None:
    first = make(batches, 1, then=False, dedups=["same"])
    held = first.entries[0].task_id
    run(store, held)
    second = make(batches, 2, dedups=["same", "same"])
    assert [(e.task_id, e.status, e.duplicate) for e in second.entries] == [
        (held, TaskStatus.COMPLETED, True), (held, TaskStatus.COMPLETED, True)]
    b = second.batch
    assert (b.status, b.counts[TaskStatus.COMPLETED], b.progress, b.completed_at is not None) == (DONE, 2, 100, True)
    assert store.get(b.then_task_id).waiting_for == ()  # done at once: its then released


def test_a_batch_over_the_cap_writes_nothing(conn, config, batches) -> None:
    capped = TaskStore(conn, Config(**{**config.__dict__, "max_active_tasks": "3"}))
    with pytest.raises(ActiveCapReached):
        make(BatchStore(capped), 3)  # 3 tasks and the then task
    assert conn.keys(keys.batch("*")) == [] and conn.hget(keys.ACTIVE, "public") is None


def test_pages_follow_submit_order_and_filter_by_status(store, batches) -> None:
    created = make(batches, 5, then=False)
    ids = [e.task_id for e in created.entries]
    run(store, ids[1])
    run(store, ids[3])
    page = batches.page(created.batch.id, limit=2, cursor=None, status=None, now=0)
    assert [t.id for t in page.tasks] == ids[:2]
    rest = batches.page(created.batch.id, limit=10, cursor=page.next_cursor, status=None, now=0)
    assert [t.id for t in rest.tasks] == ids[2:] and rest.next_cursor is None
    done = batches.page(created.batch.id, limit=1, cursor=None, status=TaskStatus.COMPLETED, now=0)
    assert [t.id for t in done.tasks] == [ids[1]]
    more = batches.page(created.batch.id, limit=1, cursor=done.next_cursor, status=TaskStatus.COMPLETED, now=0)
    assert [t.id for t in more.tasks] == [ids[3]]


def test_stored_bytes_follow_payloads_checkpoints_and_results_and_cap_a_submit(conn, config) -> None:
    """keys.STORED_BYTES: what a member's tasks hold (payload, checkpoint, cursor, results), moved by every script
    that changes it, back to nothing once they are gone; a submit past the quota writes nothing."""
    store = TaskStore(conn, Config(**{**config.__dict__, "max_stored_bytes": "2kb"}))
    held = lambda: int(conn.hget(keys.STORED_BYTES, "public") or 0)  # noqa: E731
    t = NewTask(task_id=str(uuid.uuid4()), member="public", type="demo.sleep", payload={"pad": "x" * 500},
                dedup_digest="a", priority="default", max_attempts=1)
    store.create(t)
    payload = len(b'{"pad":"' + b"x" * 500 + b'"}')
    assert held() == payload
    store.start(t.task_id, "r")
    store.report(t.task_id, "r", 10, checkpoint=b"c" * 100, cursor=b'"k"')
    assert held() == payload + 101 + 3  # the log's line ends with a newline
    store.complete(t.task_id, "r", {"out": "y" * 300}, items=None, failures=[], error_code=None)
    assert held() == len(store.get_with_result(t.task_id).task and conn.get(keys.result(t.task_id)) or b"")
    big = NewTask(**{**t.__dict__, "task_id": str(uuid.uuid4()), "dedup_digest": "b", "payload": {"pad": "x" * 2100}})
    with pytest.raises(StoredBytesReached):
        store.create(big)
    assert conn.exists(keys.task(big.task_id)) == 0
    store.expire_batch([t.task_id], now=10**13)
    assert held() == 0 and conn.hget(keys.STORED_BYTES, "public") is None


_TIMES = {b"created_at", b"updated_at", b"expires_at", b"enqueued_at"}  # a batch's tasks share one creation time


def _shared(conn, ids: list[str]) -> dict:
    """What the tasks ``ids`` left, times aside: the queues in order, RQ's set of queues, who is in the history
    and the expiry index, the counters, each task's hash and job hash, the audit trail."""
    return {
        "queues": {q.decode(): [i.decode() for i in conn.lrange(q, 0, -1)] for q in conn.smembers("rq:queues")},
        "history": sorted(i.decode() for i in conn.zrange(keys.history("public"), 0, -1)),
        "expiry": sorted(i.decode() for i in conn.zrange(keys.EXPIRY, 0, -1)),
        "counters": (conn.hget(keys.STATS, "submitted"), conn.hget(keys.ACTIVE, "public"),
                     conn.hget(keys.STORED_BYTES, "public")),
        "tasks": [{k: v for k, v in conn.hgetall(keys.task(i)).items() if k not in _TIMES} for i in ids],
        "jobs": [{k: v for k, v in conn.hgetall(f"rq:job:{i}").items() if k not in _TIMES} for i in ids],
        "audit": [e for _, e in conn.xrange(keys.AUDIT)],
        "lines": {q: (conn.hgetall(keys.lines(q)), conn.lrange(keys.ring(q), 0, -1),
                      conn.lrange(keys.line(q, "public"), 0, -1)) for q in ("default", "high")},
    }


def test_a_batch_writes_the_shared_keys_as_a_submit_of_each_of_its_tasks(conn, store, batches, config) -> None:
    """The batch create collects its tasks' writes to shared keys (app.core.creation's fold) and makes them once,
    and takes each task's job and fields as a template's differences: what it leaves is what a submit of each
    task, in order, leaves. The tasks differ in queue and payload, and one has a callback (fields of another
    shape: a second template). Their jobs join the member's lines (fair dispatch: the batch counts each line's
    tickets and seqs on from one read, app.core.waitscripts.fold_line), behind a job of an earlier submit in
    one of the two queues, the member's weight changed since."""
    from dataclasses import replace

    jobs = JobQueue(conn, config)
    batch_id = str(uuid.uuid4())
    tasks = [replace(new(batch_id, callback="https://example.com/hook" if i == 4 else ""),
                     priority=("high" if i % 3 == 0 else "default"), payload={"seconds": i % 2}) for i in range(7)]
    ids = [t.task_id for t in tasks]
    earlier = new("")

    def queued(t: NewTask, weight: int = 1):
        return [*jobs.job_commands(t.task_id, t.priority, 60), lines.line_command(t.priority, "public", t.task_id,
                                                                                  t.task_id, weight)]

    assert store.create(earlier, queued(earlier, 3)).created
    batches.create(batch_id, "public", [BatchTask(t, queued(t)) for t in tasks])
    by_batch = _shared(conn, [earlier.task_id, *ids])
    conn.flushall()
    assert store.create(earlier, queued(earlier, 3)).created
    for t in tasks:
        assert store.create(t, queued(t)).created
    by_submits = _shared(conn, [earlier.task_id, *ids])
    assert by_batch == by_submits
    assert by_batch["queues"]["rq:queue:high"] == [ids[0], ids[3], ids[6]]
    assert by_batch["counters"][0] == b"8" and len(by_batch["audit"]) == 8
    assert by_batch["lines"]["high"][2] == [i.encode() for i in (ids[0], ids[3], ids[6])]
    assert by_batch["lines"]["default"][1] == [b"public"] and by_batch["lines"]["default"][2][0] == \
        earlier.task_id.encode()


def test_a_batch_of_first_jobs_writes_what_a_submit_of_each_writes(conn, store, batches, config) -> None:
    """The web's batch sends each job as a submit does (app.core.jobs.FirstJob: app.core.submit.first_job_for):
    a template per queue, timeout and weight holds its job's commands, and each block's task id and RQ data go
    where the template says (app.core.batches._first), none of its job's values sent. What it leaves is what a
    submit of each task with the same FirstJob leaves: queues, lines, every task and job hash (RQ's times aside),
    the audit. Two queues, two timeouts, a member of weight 3, a callback (another shape of fields), a task
    waiting for its run_at and one for another task."""
    from dataclasses import replace

    jobs = JobQueue(conn, config)
    jobs._weights = {"public": 3}
    batch_id = str(uuid.uuid4())
    dep = new("")
    tasks = [replace(new(batch_id, callback="https://example.com/hook" if i == 4 else ""),
                     priority=("high" if i % 3 == 0 else "default"), payload={"seconds": i % 2}) for i in range(8)]
    ids = [t.task_id for t in tasks]
    later = now_ms() + 60_000
    plan = [(None, ())] * 6 + [(later, ()), (None, (dep.task_id,))]

    def job(t: NewTask, run_at: int | None):
        return () if run_at else jobs.first_job(t.task_id, t.priority, 60 if t.payload["seconds"] else 120, "public")

    assert store.create(dep).created
    batches.create(batch_id, "public", [BatchTask(t, job(t, run_at), run_at, after)
                                        for t, (run_at, after) in zip(tasks, plan, strict=True)])
    by_batch = _shared(conn, [dep.task_id, *ids])
    conn.flushall()
    assert store.create(dep).created
    for t, (run_at, after) in zip(tasks, plan, strict=True):
        assert store.create(t, job(t, run_at), run_at=run_at, after=after).created
    assert by_batch == _shared(conn, [dep.task_id, *ids])
    assert by_batch["queues"]["rq:queue:high"] == [ids[0], ids[3]]
    assert by_batch["jobs"][1][b"timeout"] == b"120" and by_batch["jobs"][2][b"timeout"] == b"60"
    assert by_batch["jobs"][1][b"description"] == f"task {ids[0]}".encode()
    assert by_batch["lines"]["default"][0][b"w:public"] == b"3"


def test_tasks_that_wait_are_written_by_a_batch_as_by_a_submit_each(conn, store, batches, config) -> None:
    """Blocks of other heads (a run_at ahead, each its own; tasks run after others, one after two): each task as
    its submit makes it, its key's lifetime counted from its run_at, in keys.DELAYED at its time or waiting in
    its deps' dependents sets."""
    jobs = JobQueue(conn, config)
    batch_id = str(uuid.uuid4())
    now = now_ms()
    deps = [new("") for _ in range(2)]
    tasks = [new(batch_id) for _ in range(6)]
    plan = [(None, ()), (now + 60_000, ()), (now + 7_200_000, ()), (None, (deps[0].task_id,)),
            (None, (deps[0].task_id, deps[1].task_id)), (None, ())]

    def made() -> dict:
        ids = [t.task_id for t in tasks]
        return {"tasks": [{k: v for k, v in conn.hgetall(keys.task(i)).items() if k not in _TIMES} for i in ids],
                "ttl": [round(conn.ttl(keys.task(i)), -2) for i in ids],
                "delayed": conn.zrange(keys.DELAYED, 0, -1, withscores=True),
                "waiting": sorted(conn.zrange(keys.WAITING, 0, -1)),
                "dependents": [sorted(conn.smembers(keys.dependents(d.task_id))) for d in deps],
                "queue": conn.lrange("rq:queue:default", 0, -1)}

    def setup() -> None:
        for d in deps:
            assert store.create(d).created

    setup()
    batches.create(batch_id, "public", [BatchTask(t, () if run_at else jobs.job_commands(t.task_id, "default", 60),
                                                  run_at, after) for t, (run_at, after) in zip(tasks, plan,
                                                                                               strict=True)])
    by_batch = made()
    conn.flushall()
    setup()
    for t, (run_at, after) in zip(tasks, plan, strict=True):
        job = () if run_at else jobs.job_commands(t.task_id, "default", 60)
        assert store.create(t, job, run_at=run_at, after=after).created
    assert by_batch == made()
    assert [score for _, score in by_batch["delayed"]] == [now + 60_000, now + 7_200_000]
    assert by_batch["ttl"][2] > by_batch["ttl"][0] and len(by_batch["waiting"]) == 2
    assert by_batch["queue"] == [tasks[0].task_id.encode(), tasks[5].task_id.encode()]


def test_a_cancelled_then_task_run_again_waits_for_its_running_batch_and_is_queued_once(conn, store, batches,
                                                                                       config) -> None:
    # issue 29, finding 9: the run again queued it at once (it ran before its batch ended), and the batch's end
    # released it into the delayed set again (a second job)
    jobs = JobQueue(conn, config)
    created = make(batches, 2, jobs=jobs)
    first, second = (e.task_id for e in created.entries)
    then_id, queue = created.batch.then_task_id, "rq:queue:default"
    conn.delete(queue)  # the batch's own jobs, taken by workers
    assert store.cancel(then_id).done
    then = store.get(then_id)
    job_id = rerun_job_id(then_id, then.seq)
    again = rerun(store, then_id, job_id, jobs.requeue_commands(then, job_id), budget=1).task
    assert again is not None and again.status == TaskStatus.PENDING and again.waiting_for == (created.batch.id,)
    assert conn.llen(queue) == 0 and conn.zscore(keys.DELAYED, then_id) is None  # not before its batch ends
    run(store, first)
    assert deferred.promote_due(store, jobs, now_ms()) == (0, 0) and conn.llen(queue) == 0
    run(store, second)  # the batch ends: its then task is released, once
    assert deferred.promote_due(store, jobs, now_ms() + 1) == (1, 1)
    assert conn.lrange(queue, 0, -1) == [then_id.encode()] and store.job_id(then_id) == then_id
    assert deferred.promote_due(store, jobs, now_ms() + 1) == (0, 0) and conn.llen(queue) == 1


def test_a_then_task_run_again_after_its_batch_ended_is_queued_at_once(conn, store, batches, config) -> None:
    jobs = JobQueue(conn, config)
    created = make(batches, 1, jobs=jobs)
    then_id, queue = created.batch.then_task_id, "rq:queue:default"
    conn.delete(queue)
    run(store, created.entries[0].task_id)  # the batch ends: its then task released...
    conn.zrem(keys.DELAYED, then_id)  # ...and queued by the promote tick (as it does)
    run(store, then_id, ok=False)
    then = store.get(then_id)
    job_id = rerun_job_id(then_id, then.seq)
    again = rerun(store, then_id, job_id, jobs.requeue_commands(then, job_id), budget=1).task
    assert again is not None and again.waiting_for == ()
    assert conn.lrange(queue, 0, -1) == [job_id.encode()]


def test_a_block_goes_as_every_difference_from_its_template() -> None:
    """The positions the last block differed at are tried first (app.core.batches._Template): a block differing
    elsewhere, or of another type only (1.0 for 1, True for 1: equal, not written alike), still has all its
    differences; the template with them put in is the block, value for value and type for type."""
    from app.core.batches import _Template

    template = _Template(1, ["a", 1, "b", b"c"], 0)
    assert template.diffs(["a", 1, "b", b"c"]) == []
    assert template.diffs(["x", 1, "b", b"y"]) == [1, "x", 4, b"y"]
    for block in (["x", 1.0, "b", b"y"], ["x", 1, "b", b"y"], ["x", True, "b", b"y"], ["z", 1, "b", b"c"],
                  ["z", 2, "b", b"c"], ["a", 1.0, "b", b"c"], ["a", True, "b", b"c"],
                  ["a", 1, "b", b"c"], ["a", 1, "B", b"c"], ["a", 1, "b", "c"]):
        diffs = template.diffs(block)
        rebuilt = list(template.values)
        for at, value in zip(diffs[::2], diffs[1::2], strict=True):
            rebuilt[at - 1] = value
        assert [(type(v), v) for v in rebuilt] == [(type(v), v) for v in block], block


def test_a_batchs_task_ids_are_random_uuids_as_uuid4_makes_them() -> None:
    """app.core.ids.new_task_ids: a batch's ids from one read of the system's randomness, each what
    ``str(uuid.uuid4())`` would be (version 4, RFC 4122's variant, canonical text), none twice."""
    from app.core.ids import is_task_id, new_task_ids

    ids = new_task_ids(2000)
    assert len(set(ids)) == 2000 and new_task_ids(1)[0] not in ids
    for task_id in ids:
        parsed = uuid.UUID(task_id)
        assert str(parsed) == task_id and is_task_id(task_id)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
    assert {i[19] for i in ids} == set("89ab") and {i[14] for i in ids} == {"4"}
    assert len({c for i in ids for c in i[20:]}) == 17  # 16 hex digits and the dash: the rest is random
