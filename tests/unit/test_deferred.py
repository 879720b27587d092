"""Tasks that wait before they are queued (issue 20): ``run_at`` / ``delay`` (keys.DELAYED, the promotion tick)
and ``after`` (keys.dependents, keys.SETTLED, the settle tick, -6), on the Flask test client with fakeredis."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from app.core import deferred, keys
from app.core.answers import NewTask
from app.core.clock import iso, now_ms
from app.core.jobs import JobQueue
from app.core.states import ErrorCode
from app.core.store import TaskStore
from app.web.readiness import WARNING_HEADER
from tests.unit.test_api import run_queued

SLEEP = {"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1}}


def submit(client, **extra):
    return client.post("/api/v1/tasks", json={**SLEEP, "dedup_key": uuid.uuid4().hex, **extra})


def queued(conn) -> int:
    return int(conn.llen("rq:queue:default"))


def promote(conn, config, at_ms: int) -> int:
    return deferred.promote_all_due(TaskStore(conn, config), JobQueue(conn, config), at_ms)


def settle(conn, config) -> dict[str, int]:
    return deferred.settle_all(TaskStore(conn, config), JobQueue(conn, config), now_ms())


def errors(response) -> dict[str, list[str]]:
    assert response.status_code == 422, response.get_json()
    return response.get_json()["errors"]


# -- run_at / delay -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "field"), [
    ({"delay": 5, "run_at": "2030-01-01T00:00:00Z"}, "delay"),
    ({"delay": 0}, "delay"),
    ({"delay": -1}, "delay"),
    ({"delay": 30 * 86400 + 1}, "delay"),
    ({"delay": "5"}, "delay"),  # a number, not a numeric string
    ({"run_at": "tomorrow"}, "run_at"),
    ({"run_at": "2030-01-01T00:00:00"}, "run_at"),  # no zone
    ({"run_at": (datetime.now(UTC) + timedelta(days=31)).isoformat()}, "run_at"),
])
def test_a_bad_run_at_or_delay_is_422_naming_the_field_and_stores_nothing(client, conn, extra, field) -> None:
    assert list(errors(submit(client, **extra))) == [field]
    assert conn.keys(keys.task("*")) == [] and queued(conn) == 0


def test_a_delayed_task_is_pending_with_its_run_at_unqueued_and_its_ttl_counts_from_then(client, conn, config) -> None:
    before = now_ms()
    r = submit(client, delay=600)
    doc = r.get_json()
    assert r.status_code == 202 and doc["status"] == "PENDING" and doc["waiting_for"] is None
    run_at = conn.zscore(keys.DELAYED, doc["task_id"])
    assert before + 600_000 <= run_at <= now_ms() + 600_000 and doc["run_at"] == iso(int(run_at))
    assert queued(conn) == 0 and not conn.keys("rq:job:*")  # no job until it is due
    assert WARNING_HEADER not in r.headers  # no worker listens, but nothing is queued to wait for one
    assert doc["expires_at"] == iso(int(run_at) + config.task_ttl * 1000)
    assert conn.zscore(keys.EXPIRY, doc["task_id"]) == run_at + config.task_ttl * 1000
    assert conn.ttl(keys.task(doc["task_id"])) > 600 + config.task_ttl + config.tombstone_ttl - 5
    assert r.headers["Retry-After"] == "60"  # capped
    status = client.get(doc["links"]["self"])
    assert status.get_json()["run_at"] == doc["run_at"] and status.headers["Retry-After"] == "60"


def test_retry_after_is_the_seconds_until_run_at(client) -> None:
    doc = submit(client, run_at=iso(now_ms() + 20_000)).get_json()
    assert 19 <= int(client.get(doc["links"]["self"]).headers["Retry-After"]) <= 20


def test_the_tick_queues_a_due_task_once_and_it_runs(client, conn, config) -> None:
    doc = submit(client, delay=1.5).get_json()
    run_at = int(conn.zscore(keys.DELAYED, doc["task_id"]))
    assert promote(conn, config, run_at - 1) == 0 and queued(conn) == 0  # not yet
    assert promote(conn, config, run_at) == 1 and queued(conn) == 1
    assert conn.zcard(keys.DELAYED) == 0 and promote(conn, config, run_at + 1000) == 0  # once
    run_queued(conn, config)
    done = client.get(doc["links"]["self"]).get_json()
    assert done["status"] == "COMPLETED" and done["run_at"] == doc["run_at"]


def test_a_batch_of_due_tasks_is_promoted_in_one_tick(client, conn, config, monkeypatch) -> None:
    monkeypatch.setattr(deferred, "BATCH", 3)
    for _ in range(7):
        submit(client, delay=1)
    assert promote(conn, config, now_ms() + 1000) == 7 and queued(conn) == 7 and conn.zcard(keys.DELAYED) == 0


def test_a_task_cancelled_before_it_is_due_leaves_the_set_and_never_runs(client, conn, config) -> None:
    doc = submit(client, delay=1).get_json()
    assert client.delete(doc["links"]["self"]).status_code == 204
    assert conn.zcard(keys.DELAYED) == 0
    assert promote(conn, config, now_ms() + 5000) == 0 and queued(conn) == 0
    assert client.get(doc["links"]["self"]).get_json()["status"] == "CANCELLED"


def test_the_expiry_pass_takes_an_unpromoted_task_out_of_the_set(client, conn, config) -> None:
    doc = submit(client, delay=1).get_json()
    store = TaskStore(conn, config)
    expired = store.expire_batch([doc["task_id"]], now_ms() + (config.task_ttl + 2) * 1000)
    assert [e.previous for e in expired] == ["PENDING"] and conn.zcard(keys.DELAYED) == 0


def test_a_run_at_in_the_past_runs_now(client, conn) -> None:
    r = submit(client, run_at="2020-01-01T00:00:00Z")
    assert r.status_code == 202 and r.headers["Retry-After"] == "1" and WARNING_HEADER in r.headers
    assert queued(conn) == 1 and conn.zcard(keys.DELAYED) == 0
    assert r.get_json()["run_at"] == "2020-01-01T00:00:00.000Z"


def test_a_delayed_submit_is_deduplicated_as_any(client) -> None:
    body = {**SLEEP, "dedup_key": "same", "delay": 60}
    assert client.post("/api/v1/tasks", json=body).status_code == 202
    assert client.post("/api/v1/tasks", json=body).status_code == 409


# -- after ------------------------------------------------------------------------------------------------


def test_after_names_tasks_of_the_member_only(client, conn, config) -> None:
    theirs = str(uuid.uuid4())
    TaskStore(conn, config).create(NewTask(theirs, "other", "demo.sleep", {}, theirs, "default", 1))
    mine = submit(client).get_json()["task_id"]
    assert errors(submit(client, after=[mine, theirs, str(uuid.uuid4()), "nope"])) == {
        "after.1": ["No such task."], "after.2": ["No such task."], "after.3": ["No such task."]}
    assert list(errors(submit(client, after=[]))) == ["after"]
    assert list(errors(submit(client, after=[mine] * 101))) == ["after"]


def test_a_task_runs_after_its_dependencies_complete(client, conn, config) -> None:
    first, second = submit(client).get_json()["task_id"], submit(client, delay=600).get_json()["task_id"]
    r = submit(client, after=[first, second, first])
    doc = r.get_json()
    assert r.status_code == 202 and doc["status"] == "PENDING" and doc["waiting_for"] == [first, second]
    assert WARNING_HEADER not in r.headers and queued(conn) == 1  # only the first one's job
    run_queued(conn, config)  # the first completes
    assert settle(conn, config) == {"released": 1, "failed": 0}
    assert client.get(doc["links"]["self"]).get_json()["waiting_for"] == [second]
    promote(conn, config, now_ms() + 601_000)
    run_queued(conn, config)
    assert settle(conn, config) == {"released": 1, "failed": 0}
    run_queued(conn, config)
    done = client.get(doc["links"]["self"]).get_json()
    assert done["status"] == "COMPLETED" and done["waiting_for"] is None
    assert conn.llen(keys.SETTLED) == 0 and not conn.keys(keys.dependents("*"))


def test_after_a_completed_task_runs_now(client, conn, config) -> None:
    first = submit(client).get_json()["task_id"]
    run_queued(conn, config)
    doc = submit(client, after=[first]).get_json()
    assert doc["waiting_for"] is None and queued(conn) == 1


def test_after_a_task_that_ended_otherwise_is_failed_at_once(client, conn) -> None:
    first = submit(client, delay=60).get_json()["task_id"]
    client.delete(f"/api/v1/tasks/{first}")
    r = submit(client, after=[first])
    doc = r.get_json()
    assert r.status_code == 202 and doc["status"] == "FAILED" and queued(conn) == 0
    assert doc["error"] == {"code": ErrorCode.DEPENDENCY,
                            "message": f"a task it depends on did not complete: {first} is CANCELLED"}


def test_a_failure_goes_down_the_chain_in_one_settle(client, conn, config) -> None:
    head = submit(client, payload={"seconds": 0, "steps": 1, "fail_code": 10001}).get_json()["task_id"]
    middle = submit(client, after=[head]).get_json()["task_id"]
    last = submit(client, after=[middle]).get_json()["task_id"]
    run_queued(conn, config)  # the head fails
    assert settle(conn, config) == {"released": 0, "failed": 2}
    docs = [client.get(f"/api/v1/tasks/{t}").get_json() for t in (middle, last)]
    assert [d["status"] for d in docs] == ["FAILED", "FAILED"]
    assert docs[1]["error"]["code"] == -6 and docs[1]["error"]["message"].endswith(f"{middle} is FAILED")
    assert conn.llen(keys.SETTLED) == 0 and queued(conn) == 0


def test_a_cancelled_dependent_is_not_released(client, conn, config) -> None:
    first = submit(client).get_json()["task_id"]
    waiting = submit(client, after=[first]).get_json()["task_id"]
    assert client.delete(f"/api/v1/tasks/{waiting}").status_code == 204
    run_queued(conn, config)
    assert settle(conn, config) == {"released": 0, "failed": 0} and queued(conn) == 0
    assert conn.llen(keys.SETTLED) == 0


def test_a_release_is_decided_once(client, conn, config) -> None:
    first = submit(client).get_json()["task_id"]
    waiting = submit(client, after=[first]).get_json()["task_id"]
    run_queued(conn, config)
    conn.lpush(keys.SETTLED, first)  # the same news twice (two schedulers)
    conn.sadd(keys.dependents(first), waiting)
    assert settle(conn, config) == {"released": 1, "failed": 0} and queued(conn) == 1
