"""TaskStore and its Lua scripts on fakeredis: every transition is a compare-and-set."""

from __future__ import annotations

import uuid

import pytest

from app import keys
from app.states import TRANSITIONS, TaskStatus
from app.store import NewTask, Started, decode_cursor, encode_cursor
from app.task import now_ms

S = TaskStatus


def new_task(member: str = "public", digest: str | None = None, type_: str = "demo.sleep") -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member=member, type=type_, payload={"seconds": 0},
                   dedup_digest=digest or task_id, priority="default", max_attempts=2)


def create(store, new: NewTask):
    return store.create(new, lambda pipe: None)


def started(store, new: NewTask) -> str:
    run_id = uuid.uuid4().hex
    assert isinstance(store.start(new.task_id, run_id), Started)
    return run_id


def test_create_writes_task_payload_and_indexes(store, conn, config):
    new = new_task()
    created, holder, task = create(store, new)
    assert created and holder == new.task_id
    assert task == store.get(new.task_id)
    assert task.status == S.PENDING and task.attempts == 0 and task.max_attempts == 2
    assert conn.get(keys.payload(new.task_id)) == b'{"seconds":0}'
    assert conn.zscore(keys.history("public"), new.task_id) is not None
    assert conn.zscore(keys.EXPIRY, new.task_id) is not None
    assert 0 < conn.ttl(keys.task(new.task_id)) <= config.task_ttl + config.tombstone_ttl
    assert conn.ttl(keys.dedup("public", new.dedup_digest)) == config.dedup_window


def test_duplicate_names_the_holder_and_writes_nothing(store, conn):
    first = new_task(digest="same")
    second = new_task(digest="same")
    create(store, first)
    created, holder, task = create(store, second)
    assert (created, holder, task) == (False, first.task_id, None)
    assert not conn.exists(keys.task(second.task_id), keys.payload(second.task_id))
    assert conn.zscore(keys.history("public"), second.task_id) is None


def test_dedup_is_per_member(store):
    assert create(store, new_task(member="a", digest="d"))[0]
    assert create(store, new_task(member="b", digest="d"))[0]


def test_start_is_a_compare_and_set(store):
    new = new_task()
    create(store, new)
    first = store.start(new.task_id, "run-1")
    assert isinstance(first, Started)
    assert first.payload == {"seconds": 0}
    assert first.task.status == S.PROCESSING and first.task.attempts == 1 and first.task.started_at
    assert store.start(new.task_id, "run-2") == S.PROCESSING
    assert store.get(new.task_id).run_id == "run-1"


def test_progress_is_monotonic_and_only_from_the_owning_run(store):
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    counts = {"total": 10, "succeeded": 3, "failed": 1}
    assert store.report(new.task_id, run_id, 40, "item 4 of 10", counts) == S.PROCESSING
    assert store.report(new.task_id, run_id, 20, "late") == S.PROCESSING
    assert store.report(new.task_id, "intruder", 90, "no") == S.PROCESSING
    task = store.get(new.task_id)
    assert task.progress == 40 and task.message == "late"
    assert task.items == {"total": 10, "succeeded": 3, "failed": 1}


def test_heartbeat_moves_running_score(store, conn):
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    conn.zadd(keys.RUNNING, {new.task_id: 1})
    assert store.report(new.task_id, run_id, None) == S.PROCESSING
    assert conn.zscore(keys.RUNNING, new.task_id) > 1


def test_complete_writes_result_and_starts_the_result_clock(store, conn, config):
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    assert store.complete(new.task_id, run_id, {"ok": 1}, items=None, failures=[], error_code=None)
    task, stored = store.get_with_result(new.task_id)
    assert task.status == S.COMPLETED and task.progress == 100 and task.completed_at
    assert stored == {"result": {"ok": 1}}  # empty failures and no error code are not stored
    assert conn.hget(keys.task(new.task_id), "result") == b'{"result":{"ok":1}}'  # small: inline
    assert not conn.exists(keys.payload(new.task_id), keys.result(new.task_id))
    assert conn.zscore(keys.RUNNING, new.task_id) is None
    assert conn.zscore(keys.EXPIRY, new.task_id) == pytest.approx(now_ms() + config.result_ttl * 1000, abs=5000)
    assert task.expires_at > task.completed_at


def test_a_large_result_gets_a_key_of_its_own_with_the_result_lifetime(store, conn, config):
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    big = {"rows": list(range(100))}
    assert store.complete(new.task_id, run_id, big, items=None, failures=[], error_code=10002)
    assert store.get_with_result(new.task_id)[1] == {"result": big, "error_code": 10002}
    assert conn.hget(keys.task(new.task_id), "result") is None
    assert 0 < conn.ttl(keys.result(new.task_id)) <= config.result_ttl


def test_cancel_wins_over_a_late_finish(store, conn):
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    assert store.cancel(new.task_id) == (True, S.PROCESSING)
    assert not store.complete(new.task_id, run_id, {"late": True}, items=None, failures=[], error_code=None)
    assert store.report(new.task_id, run_id, 99, "late") == S.CANCELLED
    assert store.get(new.task_id).status == S.CANCELLED
    assert not conn.exists(keys.result(new.task_id))
    assert store.cancel(new.task_id) == (False, S.CANCELLED)


def test_fail_records_the_error(store):
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    assert store.fail(new.task_id, run_id, 10001, "bill unpaid")
    doc = store.get(new.task_id).to_doc(now_ms())
    assert doc["status"] == S.FAILED and doc["error"] == {"code": 10001, "message": "bill unpaid"}


def test_retry_returns_to_pending_and_a_new_run_counts_an_attempt(store):
    new = new_task()
    create(store, new)
    run_id = started(store, new)
    assert store.retry(new.task_id, run_id, "again")
    assert store.get(new.task_id).status == S.PENDING
    again = store.start(new.task_id, "run-2")
    assert isinstance(again, Started) and again.task.attempts == 2
    assert not store.retry(new.task_id, run_id, "stale run")


def test_read_past_expires_at_is_expired_before_housekeeping(store):
    new = new_task()
    _, _, task = create(store, new)
    doc = task.to_doc(253_402_300_799_000)
    assert doc["status"] == S.EXPIRED and doc["error"]["code"] == -4


def test_history_pages_newest_first_with_filters(store, monkeypatch):
    clock = iter(range(1_800_000_000_000, 1_800_000_100_000, 1000))
    monkeypatch.setattr("app.store.now_ms", lambda: next(clock))
    made = []
    for i in range(7):
        new = new_task(type_="demo.sleep" if i % 2 else "orders.split")
        create(store, new)
        made.append(new.task_id)
    page = store.history("public", limit=3)
    assert [t.id for t in page.tasks] == made[::-1][:3]
    rest = store.history("public", limit=10, cursor=page.next_cursor)
    assert [t.id for t in rest.tasks] == made[::-1][3:] and rest.next_cursor is None
    only = store.history("public", limit=10, type_="orders.split")
    assert [t.id for t in only.tasks] == made[::-2]
    assert store.history("someone-else", limit=10).tasks == []


def test_history_cursor_is_stable_for_tasks_created_in_the_same_millisecond(store, monkeypatch):
    monkeypatch.setattr("app.store.now_ms", lambda: 1_800_000_000_000)
    made = {create(store, new_task())[1] for _ in range(9)}
    seen, cursor = [], None
    while True:
        page = store.history("public", limit=4, cursor=cursor, now=0)
        seen += [t.id for t in page.tasks]
        if not (cursor := page.next_cursor):
            break
    assert sorted(seen) == sorted(made)


def test_cursor_round_trip_and_rejects_garbage():
    assert decode_cursor(encode_cursor((1700000000000.0, 3))) == (1700000000000.0, 3)
    for bad in ("x", "!!", encode_cursor((1.0, 1))[:-2] + "@@"):
        with pytest.raises(ValueError):
            decode_cursor(bad)


def test_every_transition_the_store_performs_is_in_the_table():
    performed = {
        (S.PENDING, S.PROCESSING), (S.PROCESSING, S.COMPLETED), (S.PROCESSING, S.FAILED),
        (S.PROCESSING, S.PENDING), (S.PENDING, S.CANCELLED), (S.PROCESSING, S.CANCELLED),
    }
    assert performed <= TRANSITIONS


def test_every_key_has_the_prefix():
    built = [keys.task("x"), keys.payload("x"), keys.result("x"), keys.events("x"), keys.dedup("m", "d"),
             keys.history("m"), keys.housekeeping_lock("j"), *keys.all_static()]
    assert all(k.startswith(keys.PREFIX) for k in built)
    assert all("{x}" in k for k in built[:4])
