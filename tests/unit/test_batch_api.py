"""POST /api/v1/batches through the app (fakeredis): one refusal names every field at fault by index and stores
nothing; the rate limit counts a batch's tasks; its documents and its tasks' documents name each other."""

from __future__ import annotations

import fakeredis
import pytest

from app.core import keys
from app.core.config import Config
from app.web import create_app

KEYED = {"TASKPORT_API_KEYS": "ka:alice", "TASKPORT_RATE_LIMIT": "4/minute", "TASKPORT_ALLOWED_HOSTS": "localhost"}
AUTH = {"Authorization": "Bearer ka"}


def sleep(n: int) -> dict:
    return {"type": "demo.sleep", "payload": {"steps": 1}, "dedup_key": f"k{n}"}


@pytest.fixture
def conn() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def client(conn: fakeredis.FakeRedis, env: dict[str, str] | None = None):
    return create_app(Config.from_env(env or {}), conn).test_client()


def test_every_fault_of_every_task_is_named_by_index_and_nothing_is_stored(conn) -> None:
    bad = [sleep(0), {"type": "nosuch"}, {"type": "demo.sleep", "payload": {"steps": "x"}, "extra": 1}]
    answer = client(conn).post("/api/v1/batches", json={"tasks": bad, "then": {"type": "demo.sleep", "delay": 5},
                                                        "callback": {"url": "https://example.com", "events": []}})
    assert answer.status_code == 422 and answer.content_type == "application/problem+json"
    assert set(answer.get_json()["errors"]) == {"tasks.1.type", "tasks.2.extra", "then.delay", "callback.events"}
    assert conn.keys(f"{keys.PREFIX}*") == [] and conn.llen("rq:queue:default") == 0


@pytest.mark.parametrize("body", [{}, {"tasks": []}, {"tasks": [sleep(0)] * 1001}, {"tasks": {"a": 1}}, [1]])
def test_a_body_that_is_no_batch_is_refused_clearly(conn, body) -> None:
    answer = client(conn).post("/api/v1/batches", json=body)
    assert answer.status_code in (400, 422) and answer.content_type == "application/problem+json"


def test_the_rate_limit_counts_each_task_and_refuses_a_batch_past_its_window(conn) -> None:
    app = client(conn, KEYED)
    too_big = app.post("/api/v1/batches", json={"tasks": [sleep(i) for i in range(10, 16)]}, headers=AUTH)
    assert too_big.status_code == 422 and "at most 4 per batch" in too_big.get_json()["errors"]["tasks"][0]
    assert app.post("/api/v1/batches", json={"tasks": [sleep(1), sleep(2)]}, headers=AUTH).status_code == 202
    assert app.post("/api/v1/batches", json={"tasks": [sleep(3), sleep(4)], "then": sleep(5)},
                    headers=AUTH).status_code == 429  # 2 + 3 tasks > 4 a minute


def test_a_task_of_a_batch_names_its_batch_and_the_batch_its_then(conn) -> None:
    app = client(conn)
    batch = app.post("/api/v1/batches", json={"tasks": [sleep(1)], "then": {"type": "batch.summary"}}).get_json()
    task = app.get(f"/api/v1/tasks/{batch['tasks'][0]['task_id']}").get_json()
    then = app.get(batch["links"]["then"]).get_json()
    assert task["batch_id"] == then["batch_id"] == batch["batch_id"]
    assert then["status"] == "PENDING" and then["waiting_for"] == [batch["batch_id"]]
    assert app.get(f"/api/v1/batches/{batch['batch_id']}/tasks?cursor=nope").status_code == 422


def test_a_batch_is_made_with_the_garbage_collector_paused_and_resumed_after(conn, monkeypatch) -> None:
    """Its thousand tasks' containers set off the collector's whole-heap passes (bench/README.md, "Batch submit
    per task"): paused while a batch is made, refused or not, and running again after."""
    import gc

    from app.core.batches import BatchStore

    seen = []
    create = BatchStore.create

    def spy(self, *args, **kwargs):
        seen.append(gc.isenabled())
        return create(self, *args, **kwargs)

    monkeypatch.setattr(BatchStore, "create", spy)
    app = client(conn)
    assert gc.isenabled()
    assert app.post("/api/v1/batches", json={"tasks": [sleep(1), sleep(2)]}).status_code == 202
    assert app.post("/api/v1/batches", json={"tasks": [{"type": "nosuch"}]}).status_code == 422
    assert seen == [False] and gc.isenabled()


def test_the_collector_resumes_with_the_last_batch_in_flight_and_only_if_it_ran() -> None:
    import gc

    from app.web.api.batches import collector_paused

    first, second = collector_paused(), collector_paused()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second batch is still being made
    second.__exit__(None, None, None)
    assert gc.isenabled()
    gc.disable()  # a process that runs without it keeps it off
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_batch_of_finished_duplicates_is_done_at_once_and_releases_its_then(conn) -> None:
    """Every task of the batch a duplicate of a finished one: the create ends the batch in its own step and releases
    its then task (the fuzzer's 500: the create looked for the first block's task key where a template's key is)."""
    app = client(conn)
    first = app.post("/api/v1/batches", json={"tasks": [sleep(1), sleep(2)]}).get_json()
    for task in first["tasks"]:
        conn.hset(keys.task(task["task_id"]), "status", "COMPLETED")
    answer = app.post("/api/v1/batches", json={"tasks": [sleep(1), sleep(2)], "then": {"type": "batch.summary"}})
    assert answer.status_code == 202, answer.get_json()
    batch = answer.get_json()
    assert batch["status"] == "DONE" and [t["duplicate"] for t in batch["tasks"]] == [True, True]
    then = app.get(batch["links"]["then"]).get_json()
    assert then["status"] == "PENDING" and then["waiting_for"] is None
