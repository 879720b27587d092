"""Quotas per member: the cap on unfinished tasks (in the submit script), who may submit priority high,
and the size limits of the built-in payloads."""

from __future__ import annotations

import uuid

import pytest

from app.core.answers import ActiveCapReached, NewTask
from app.core.config import KEYED_MAX_ACTIVE_TASKS, Config, ConfigError
from app.core.indexes import ActiveCounts
from app.core.lua import Command
from app.core.states import ErrorCode, TaskStatus
from app.core.store import TaskStore
from app.web import create_app

TASKS = "/api/v1/tasks"
ALICE, BOB = {"Authorization": "Bearer ka"}, {"Authorization": "Bearer kb"}


def new_task(member: str = "alice") -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id=task_id, member=member, type="demo.sleep", payload={}, dedup_digest=task_id,
                   priority="default", max_attempts=1)


def capped_store(conn, tmp_path, cap: int) -> TaskStore:
    config = Config.from_env({"TASKPORT_MAX_ACTIVE_TASKS": str(cap)}, redis_url="redis://fake", data_dir=tmp_path)
    return TaskStore(conn, config)


def make_client(tmp_path, conn, **env: str):
    config = Config.from_env(env, redis_url="redis://fake", data_dir=tmp_path)
    return create_app(config, conn=conn).test_client()


def test_cap_defaults_are_on_with_keys_and_off_in_open_mode() -> None:
    assert Config.from_env({}).active_task_cap == 0
    assert Config.from_env({"TASKPORT_API_KEYS": "k:a"}).active_task_cap == KEYED_MAX_ACTIVE_TASKS
    assert Config.from_env({"TASKPORT_API_KEYS": "k:a", "TASKPORT_MAX_ACTIVE_TASKS": "off"}).active_task_cap == 0
    assert Config.from_env({"TASKPORT_MAX_ACTIVE_TASKS": "7"}).active_task_cap == 7
    for bad in ("0", "-1", "many", "1e3"):
        with pytest.raises(ConfigError, match="TASKPORT_MAX_ACTIVE_TASKS"):
            Config.from_env({"TASKPORT_MAX_ACTIVE_TASKS": bad})


def test_the_cap_refuses_writing_nothing_and_every_way_out_frees_a_slot(conn, tmp_path) -> None:
    store = capped_store(conn, tmp_path, 3)
    a, b, c = new_task(), new_task(), new_task()
    for t in (a, b, c):
        assert store.create(t)[0]
    keys_before = set(conn.keys())
    refused = new_task()
    with pytest.raises(ActiveCapReached) as caught:
        store.create(refused, [Command("SET", "{tp}:job-marker", (1,))])
    assert (caught.value.cap, caught.value.active) == (3, 3)
    assert set(conn.keys()) == keys_before  # no task, no dedup key, no job command
    assert store.create(new_task("bob"))[0]  # another member's count is its own

    # cancel (PENDING), complete, fail, expire: each frees exactly one slot, once
    assert store.cancel(a.task_id)[0]
    assert not store.cancel(a.task_id)[0]
    assert ActiveCounts(store.redis).of("alice") == 2
    run = uuid.uuid4().hex
    assert store.start(b.task_id, run).started is not None
    assert ActiveCounts(store.redis).of("alice") == 2  # PENDING -> PROCESSING is still unfinished
    assert store.retry(b.task_id, run, "again")  # and back to PENDING too
    assert ActiveCounts(store.redis).of("alice") == 2
    assert store.start(b.task_id, run).started is not None
    assert store.complete(b.task_id, run, {"ok": 1}, items=None, failures=[], error_code=None)
    assert ActiveCounts(store.redis).of("alice") == 1
    d = new_task()
    assert store.create(d)[0]
    assert store.expire_batch([c.task_id, a.task_id, b.task_id], now=10**15)  # terminal -> EXPIRED: no change
    assert ActiveCounts(store.redis).of("alice") == 1
    run = uuid.uuid4().hex
    assert store.start(d.task_id, run).started is not None
    assert store.fail(d.task_id, run, ErrorCode.WORKER_LOST, "lost")
    assert ActiveCounts(store.redis).of("alice") == 0
    assert conn.hget("{tp}:active", "alice") is None  # a member with none is no field at all


def test_a_duplicate_at_the_cap_is_still_answered_as_a_duplicate(conn, tmp_path) -> None:
    store = capped_store(conn, tmp_path, 1)
    first = new_task()
    assert store.create(first)[0]
    same = NewTask(**{**first.__dict__, "task_id": str(uuid.uuid4())})
    answer = store.create(same)
    assert (answer.created, answer.task_id) == (False, first.task_id)
    assert answer.task is not None and answer.task.id == first.task_id  # the holder's record, same round trip


def test_unfinished_tasks_expiring_free_their_slots(conn, tmp_path) -> None:
    store = capped_store(conn, tmp_path, 2)
    pending, running = new_task(), new_task()
    for t in (pending, running):
        store.create(t)
    store.start(running.task_id, "r1")
    left = store.expire_batch([pending.task_id, running.task_id], now=10**15)
    assert {status for _, status, _ in left} == {TaskStatus.PENDING, TaskStatus.PROCESSING}
    assert ActiveCounts(store.redis).of("alice") == 0


def test_over_the_cap_is_429_problem_naming_it_with_retry_after(tmp_path, conn) -> None:
    client = make_client(tmp_path, conn, TASKPORT_API_KEYS="ka:alice,kb:bob", TASKPORT_MAX_ACTIVE_TASKS="2")
    body = {"type": "demo.sleep", "payload": {"seconds": 60}}
    ids = [client.post(TASKS, json={**body, "dedup_key": str(n)}, headers=ALICE).get_json()["task_id"]
           for n in range(2)]
    over = client.post(TASKS, json={**body, "dedup_key": "3"}, headers=ALICE)
    assert over.status_code == 429 and over.content_type == "application/problem+json"
    problem = over.get_json()
    assert (problem["limit"], problem["cap"], problem["active"]) == ("max_active_tasks", 2, 2)
    assert "TASKPORT_MAX_ACTIVE_TASKS" in problem["detail"] and "alice" not in problem["detail"]
    assert int(over.headers["Retry-After"]) >= 1
    assert client.post(TASKS, json={**body, "dedup_key": "3"}, headers=BOB).status_code == 202
    assert client.delete(f"{TASKS}/{ids[0]}", headers=ALICE).status_code == 204
    assert client.post(TASKS, json={**body, "dedup_key": "3"}, headers=ALICE).status_code == 202


@pytest.mark.parametrize(("headers", "expected"), [(ALICE, 403), (BOB, 202)])
def test_priority_high_only_for_keys_granted_it(tmp_path, conn, headers, expected) -> None:
    client = make_client(tmp_path, conn, TASKPORT_API_KEYS="ka:alice,kb:bob:high")
    answer = client.post(TASKS, json={"type": "demo.sleep", "priority": "high"}, headers=headers)
    assert answer.status_code == expected
    if expected == 403:
        assert answer.content_type == "application/problem+json"
        assert list(answer.get_json()["errors"]) == ["priority"]
    for other in ("default", "low"):
        assert client.post(TASKS, json={"type": "demo.sleep", "priority": other, "dedup_key": other},
                           headers=headers).status_code == 202


def test_open_mode_may_submit_priority_high(client) -> None:
    assert client.post(TASKS, json={"type": "demo.sleep", "priority": "high"}).status_code == 202


def test_a_malformed_grant_stops_the_process() -> None:
    with pytest.raises(ConfigError, match="key:member:high"):
        Config.from_env({"TASKPORT_API_KEYS": "k:alice:root"})
    assert Config.from_env({"TASKPORT_API_KEYS": "k:alice:high,j:bob"}).grants == {"k": ("alice", True),
                                                                                  "j": ("bob", False)}


@pytest.mark.parametrize(("task_type", "payload", "field"), [
    ("orders.split", {"order_code": "O" * 101, "items": [{"item_code": "a", "quantity": 1}]}, "payload.order_code"),
    ("orders.split", {"order_code": "O", "items": [{"item_code": "a" * 101, "quantity": 1}]},
     "payload.items.0.item_code"),
    ("orders.split", {"order_code": "O", "items": [{"item_code": "a", "quantity": 1, "warehouse": "w" * 101}]},
     "payload.items.0.warehouse"),
    ("orders.split", {"order_code": "O", "items": [{"item_code": "a", "quantity": 1}] * 10_001}, "payload.items"),
    ("demo.sleep", {"fail_items": [1] * 100_001}, "payload.fail_items"),
])
def test_payload_fields_have_size_limits_named_in_the_422(client, task_type, payload, field) -> None:
    answer = client.post(TASKS, json={"type": task_type, "payload": payload})
    assert answer.status_code == 422 and answer.content_type == "application/problem+json"
    assert list(answer.get_json()["errors"]) == [field]
