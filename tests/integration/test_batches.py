"""Batches through real processes (issue 21): a web, two workers and a scheduler on a real Redis.

A batch's tasks run like any others; its counters follow them; its ``then`` task is queued once when the last
task ends, even when the last two end at the same moment on two workers, and reads its batch through its
context; a bad task refuses the whole batch and stores nothing; cancelling a batch cancels its then task.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from app.core import keys
from tests.integration.harness import Api, Stack, started_stack, wait_until


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("batches"), worker=False) as s:
        s.start_worker(2)
        s.start_scheduler()
        yield s


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Api]:
    with Api(stack.base_url) as client:
        yield client


def sleep(seconds: float = 0, **payload: object) -> dict:
    return {"type": "demo.sleep", "payload": {"seconds": seconds, "steps": 1, **payload}, "dedup_key": uuid.uuid4().hex}


def batch_done(api: Api, batch_id: str, timeout: float = 15) -> dict:
    return wait_until(lambda: (doc := api.get(f"/api/v1/batches/{batch_id}").json())["status"] == "DONE" and doc,
                      timeout=timeout, interval=0.1, message=f"batch {batch_id} DONE")


def test_a_batch_runs_its_tasks_then_its_summary_once(api: Api, stack: Stack) -> None:
    body = {"tasks": [sleep(items=4, fail_items=[1]), sleep(fail_code=7), sleep()],
            "then": {"type": "batch.summary", "payload": {}}}
    answer = api.post("/api/v1/batches", json=body)
    assert answer.status_code == 202, answer.text
    batch = answer.json()
    assert answer.headers["Location"] == batch["links"]["self"]
    assert [t["duplicate"] for t in batch["tasks"]] == [False] * 3 and batch["status"] == "RUNNING"
    done = batch_done(api, batch["batch_id"])
    assert done["counts"] == {"PENDING": 0, "PROCESSING": 0, "COMPLETED": 2, "FAILED": 1, "CANCELLED": 0,
                              "EXPIRED": 0}
    assert (done["progress"], done["items"]) == (100, {"total": 4, "succeeded": 3, "failed": 1})
    summary = api.wait_for(done["then_task_id"], "COMPLETED", timeout=10)
    assert summary["attempts"] == 1 and summary["batch_id"] == batch["batch_id"]
    result = api.get(f"/api/v1/tasks/{done['then_task_id']}/result").json()["result"]
    ids = [t["task_id"] for t in batch["tasks"]]
    assert [t["task_id"] for t in result["tasks"]] == ids
    assert [t["status"] for t in result["tasks"]] == ["COMPLETED", "FAILED", "COMPLETED"]
    assert result["tasks"][1]["error"]["code"] == 7 and "result" in result["tasks"][0]


def test_then_runs_once_when_the_last_two_tasks_end_together_on_two_workers(api: Api, stack: Stack) -> None:
    batches = []
    for _ in range(8):
        answer = api.post("/api/v1/batches", json={"tasks": [sleep(0.3), sleep(0.3)],
                                                   "then": {"type": "demo.sleep", "payload": {"steps": 1}}})
        assert answer.status_code == 202, answer.text
        batches.append(answer.json())
    conn = stack.redis()
    for batch in batches:
        then = api.wait_for(batch_done(api, batch["batch_id"])["then_task_id"], "COMPLETED", timeout=15)
        assert then["attempts"] == 1
        entries: Any = conn.xrange(keys.AUDIT)
        starts = [e for _, e in entries if e[b"task"] == then["task_id"].encode() and e[b"to"] == b"PROCESSING"]
        assert len(starts) == 1, starts
    ended = {}
    for batch in batches:  # the two tasks of a batch did overlap: they ran side by side on the two workers
        docs = [api.status(t["task_id"]) for t in batch["tasks"]]
        ended[batch["batch_id"]] = max(d["started_at"] for d in docs) < min(d["completed_at"] for d in docs)
    assert sum(ended.values()) >= 4, ended


def test_one_bad_payload_in_1000_tasks_stores_nothing(api: Api, stack: Stack) -> None:
    conn = stack.redis()
    before = (conn.dbsize(), conn.llen("rq:queue:default"))
    tasks = [sleep() for _ in range(1000)]
    tasks[637] = {"type": "orders.split", "payload": {"order_code": "A", "items": [{"item_code": "x",
                                                                                    "quantity": "three"}]}}
    answer = api.post("/api/v1/batches", json={"tasks": tasks})
    assert answer.status_code == 422, answer.text
    problem = answer.json()
    assert answer.headers["Content-Type"].startswith("application/problem+json")
    assert list(problem["errors"]) == ["tasks.637.payload.items.0.quantity"], problem
    assert (conn.dbsize(), conn.llen("rq:queue:default")) == before


def test_a_duplicate_is_referenced_and_cancelling_a_batch_cancels_its_then(api: Api, stack: Stack) -> None:
    first = api.post("/api/v1/tasks", json=sleep(30)).json()
    again = {"type": "demo.sleep", "payload": {"seconds": 30, "steps": 1}}
    body = {"tasks": [again, sleep(30)], "then": {"type": "demo.sleep", "payload": {}}}
    answer = api.post("/api/v1/batches", json=body).json()
    assert answer["tasks"][0]["task_id"] != first["task_id"]  # no dedup key: the payload's own digest
    twin = api.post("/api/v1/batches", json=body).json()
    assert twin["tasks"][0]["task_id"] == answer["tasks"][0]["task_id"] and twin["tasks"][0]["duplicate"]
    assert twin["tasks"][0]["status"] in ("PENDING", "PROCESSING")
    assert api.delete(f"/api/v1/batches/{answer['batch_id']}").status_code == 204
    done = batch_done(api, answer["batch_id"], timeout=10)
    assert done["counts"]["CANCELLED"] == 2
    assert api.status(done["then_task_id"])["status"] == "CANCELLED"
    assert batch_done(api, twin["batch_id"])["counts"]["CANCELLED"] >= 1  # the held task counts in both
    assert api.delete(f"/api/v1/batches/{twin['batch_id']}").status_code == 204


def test_someone_else_s_or_an_unknown_batch_is_404(api: Api) -> None:
    for path in (f"/api/v1/batches/{uuid.uuid4()}", "/api/v1/batches/nosuch", f"/api/v1/batches/{uuid.uuid4()}/tasks"):
        answer = api.get(path)
        assert answer.status_code == 404 and answer.json()["title"], path
    assert api.delete(f"/api/v1/batches/{uuid.uuid4()}").status_code == 404


def test_the_batch_stream_sends_each_change_and_ends_after_done(api: Api, stack: Stack) -> None:
    batch = api.post("/api/v1/batches", json={"tasks": [sleep(0.5), sleep(1)]}).json()
    events = []
    with requests.get(stack.url(f"/api/v1/batches/{batch['batch_id']}/events"), stream=True, timeout=20) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
    assert events[-1]["status"] == "DONE" and events[-1]["counts"]["COMPLETED"] == 2
    assert len(events) >= 2 and [e["status"] for e in events[:-1]] == ["RUNNING"] * (len(events) - 1)
