"""The HTTP contract (shared/spec/api.md) over real HTTP: gunicorn, one real RQ worker, a real redis-server.

Most tests share one module-wide stack (web + fork worker, open mode, a small body limit, the user
processors of tests/userprocs loaded); settings that would disturb it (API keys, a one-second result
time, a Redis outage) get their own small stack on their own redis-server.
"""

from __future__ import annotations

import io
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openpyxl
import pytest
import requests

from tests.integration.harness import TASKS, Api, RedisServer, Stack, started_stack, wait_until

MAX_BODY = 16 * 1024
DOC_KEYS = {"task_id", "type", "status", "progress", "message", "items", "error", "attempts", "resumed",
            "created_at", "started_at", "updated_at", "completed_at", "expires_at", "run_at", "waiting_for",
            "batch_id", "callback", "links"}
STAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
UUID4 = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
LEAKS = re.compile(r"\{tp\}:|traceback|redis", re.IGNORECASE)
EXPORT_HEADER = ["order_code", "order_date", "customer", "items", "amount", "currency", "status"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The module's stack (named ``stack`` so a failing test's report carries its process logs)."""
    with started_stack(tmp_path_factory.mktemp("contract"), max_body=MAX_BODY,
                       processors="tests.userprocs.tasks") as s:
        yield s


@pytest.fixture(scope="module")
def api(stack: Stack) -> Iterator[Api]:
    with Api(stack.base_url) as client:
        yield client


@pytest.fixture
def side_stack(redis_factory: Callable[..., RedisServer], tmp_path: Path) -> Iterator[Callable[..., tuple[Stack,
                                                                                                           RedisServer]]]:
    """``side_stack(**settings)``: a Stack (nothing started) on a redis-server of its own."""
    made: list[Stack] = []

    def make(**overrides: Any) -> tuple[Stack, RedisServer]:
        server = redis_factory()
        made.append(Stack(server.url, tmp_path / f"side-{len(made) + 1}", **overrides))
        return made[-1], server

    yield make
    for s in made:
        s.teardown()


def assert_clean(text: str) -> None:
    """No Redis key, stack trace or mention of the store's internals in a body."""
    assert not LEAKS.search(text), text


def assert_problem(response: requests.Response, status: int) -> dict[str, Any]:
    """An RFC 9457 problem of ``status``; returns its body."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["Content-Type"].startswith("application/problem+json"), response.headers
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"] and body["title"] and body["detail"], body
    assert_clean(response.text)
    return body


def assert_duplicate(response: requests.Response, task_id: str) -> dict[str, Any]:
    """The 409 of a duplicate submit: problem+json whose ``status`` is the contract's "DUPLICATE"."""
    assert response.status_code == 409, (response.status_code, response.text)
    assert response.headers["Content-Type"].startswith("application/problem+json"), response.headers
    assert response.headers["X-Task-Deduplicated"] == "true"
    assert response.headers["Location"] == f"{TASKS}/{task_id}"
    body: dict[str, Any] = response.json()
    assert body["task_id"] == task_id and body["status"] == "DUPLICATE" and body["duplicate"] is True
    assert isinstance(body["message"], str) and body["message"]
    assert body["type"] and body["title"] and body["detail"], body
    assert_document(body["existing"], task_id)
    assert_clean(response.text)
    return body


def assert_document(doc: dict[str, Any], task_id: str | None = None) -> None:
    assert set(doc) - {"queue"} == DOC_KEYS, doc
    if "queue" in doc:  # a queued task's place in line (docs/api.md): PENDING only
        assert doc["status"] == "PENDING" and set(doc["queue"]) == {"position", "estimated_start"}, doc
        assert isinstance(doc["queue"]["position"], int) and doc["queue"]["position"] >= 0, doc
    assert UUID4.fullmatch(doc["task_id"]), doc
    if task_id is not None:
        assert doc["task_id"] == task_id
    for name in ("created_at", "started_at", "updated_at", "completed_at", "expires_at"):
        assert doc[name] is None or STAMP.fullmatch(doc[name]), (name, doc[name])
    path = f"{TASKS}/{doc['task_id']}"
    assert doc["links"] == {"self": path, "result": f"{path}/result", "events": f"{path}/events"}
    assert isinstance(doc["progress"], int) and 0 <= doc["progress"] <= 100


def task_count(api: Api) -> int:
    response = api.get(TASKS, params={"limit": 200})
    assert response.status_code == 200
    return len(response.json()["tasks"])


def order(code: str, *items: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"order_code": code, "items": list(items) or [{"item_code": "A", "quantity": 1}], **extra}


def unique() -> str:
    return uuid.uuid4().hex[:12]


# -- submit -----------------------------------------------------------------------------------------


def test_submit_is_202_with_location_retry_after_and_the_pending_document(api: Api) -> None:
    response = api.submit("orders.split", order(f"O-{unique()}"))
    assert response.status_code == 202, response.text
    assert response.headers["Content-Type"] == "application/json; charset=utf-8"
    doc = response.json()
    assert_document(doc)
    assert response.headers["Location"] == f"{TASKS}/{doc['task_id']}"
    assert response.headers["Retry-After"] == "1"
    assert doc["status"] == "PENDING" and doc["type"] == "orders.split"
    assert (doc["progress"], doc["attempts"], doc["error"], doc["items"]) == (0, 0, None, None)
    assert doc["started_at"] is None and doc["completed_at"] is None
    assert doc["expires_at"] > doc["created_at"]
    assert api.wait_for(doc["task_id"], "COMPLETED")["attempts"] == 1


def test_completed_result_carries_items_failures_and_the_last_error_code(api: Api) -> None:
    code = f"O-{unique()}"
    task_id = api.create("orders.split", order(
        code,
        {"item_code": "A", "quantity": 2},
        {"item_code": "B", "quantity": 0},
        {"item_code": "C", "quantity": 1, "warehouse": "east"},
        {"item_code": "D", "quantity": 3},
    ))
    done = api.wait_for(task_id, "COMPLETED")
    status = api.get(f"{TASKS}/{task_id}")
    assert status.status_code == 200 and "Retry-After" not in status.headers
    assert_document(done, task_id)
    assert done["progress"] == 100 and done["error"] is None and done["completed_at"]
    assert done["items"] == {"total": 4, "succeeded": 3, "failed": 1}

    response = api.get(f"{TASKS}/{task_id}/result")
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"task_id", "status", "result", "items", "failures", "error_code", "completed_at",
                         "expires_at"}
    assert body["task_id"] == task_id and body["status"] == "COMPLETED"
    assert body["result"] == {"order_code": code, "shipments": [
        {"warehouse": "main", "items": [{"item_code": "A", "quantity": 2}, {"item_code": "D", "quantity": 3}]},
        {"warehouse": "east", "items": [{"item_code": "C", "quantity": 1}]},
    ]}
    assert body["items"] == {"total": 4, "succeeded": 3, "failed": 1}
    assert [(f["item"], f["code"]) for f in body["failures"]] == [("B", 10002)]
    assert body["failures"][0]["message"]
    assert body["error_code"] == 10002
    assert (body["completed_at"], body["expires_at"]) == (done["completed_at"], done["expires_at"])


def test_running_task_status_and_result_say_come_back_then_cancel_is_204_then_409(api: Api) -> None:
    task_id = api.create("demo.sleep", {"seconds": 5, "steps": 50}, dedup_key=unique())
    api.wait_for(task_id, "PROCESSING")
    status = api.get(f"{TASKS}/{task_id}")
    assert status.status_code == 200 and status.headers["Retry-After"] == "1"
    result = api.get(f"{TASKS}/{task_id}/result")
    assert result.status_code == 202 and result.headers["Retry-After"] == "1"
    assert_document(result.json(), task_id)
    assert result.json()["status"] == "PROCESSING"

    cancel = api.delete(f"{TASKS}/{task_id}")
    assert cancel.status_code == 204 and cancel.content == b""
    status = api.get(f"{TASKS}/{task_id}")
    assert status.status_code == 200 and status.json()["status"] == "CANCELLED"
    assert "Retry-After" not in status.headers
    again = assert_problem(api.delete(f"{TASKS}/{task_id}"), 409)
    assert again["task_status"] == "CANCELLED"
    conflict = assert_problem(api.get(f"{TASKS}/{task_id}/result"), 409)
    assert conflict["task_status"] == "CANCELLED" and conflict["error"] is None


def test_failed_task_result_is_409_with_the_business_error(api: Api) -> None:
    task_id = api.create("orders.split", order(f"O-{unique()}", account_status="suspended"))
    doc = api.wait_for(task_id, "FAILED")
    error = {"code": 10001, "message": "bill unpaid: settle the account first"}
    assert doc["error"] == error and doc["completed_at"]
    body = assert_problem(api.get(f"{TASKS}/{task_id}/result"), 409)
    assert body["task_status"] == "FAILED" and body["error"] == error
    assert assert_problem(api.delete(f"{TASKS}/{task_id}"), 409)["task_status"] == "FAILED"


# -- dedup ------------------------------------------------------------------------------------------


def test_duplicate_is_409_naming_the_existing_task_for_any_key_order(api: Api) -> None:
    code = f"O-{unique()}"
    json_type = {"Content-Type": "application/json"}
    body = {"type": "orders.split", "payload": {"order_code": code, "items": [{"item_code": "A", "quantity": 1}]}}
    first = api.post(TASKS, data=json.dumps(body, separators=(",", ":")), headers=json_type)
    assert first.status_code == 202, first.text
    task_id = first.json()["task_id"]
    before = task_count(api)
    # the same payload with every object's keys in another order, and whitespace
    reordered = {"payload": {"items": [{"quantity": 1, "item_code": "A"}], "order_code": code}, "type": "orders.split"}
    assert json.dumps(reordered, indent=2) != json.dumps(body)
    response = api.post(TASKS, data=json.dumps(reordered, indent=2), headers=json_type)
    assert assert_duplicate(response, task_id)["existing"]["status"] in ("PENDING", "PROCESSING", "COMPLETED")

    api.wait_for(task_id, "COMPLETED")
    held = api.submit("orders.split", order(code))  # the key stays held whatever became of the task
    assert assert_duplicate(held, task_id)["existing"]["status"] == "COMPLETED"
    assert task_count(api) == before


def test_dedup_key_and_idempotency_key_header_mean_the_same(api: Api) -> None:
    key = f"k-{unique()}"
    task_id = api.create("demo.sleep", {"steps": 1}, dedup_key=key)
    assert_duplicate(api.submit("demo.sleep", {"steps": 1}, headers={"Idempotency-Key": key}), task_id)
    assert_duplicate(api.submit("demo.sleep", {"steps": 1}, dedup_key=key, headers={"Idempotency-Key": key}), task_id)
    assert_duplicate(api.submit("demo.sleep", {"steps": 3}, dedup_key=key), task_id)  # a body key: the same task
    reused = assert_problem(api.submit("demo.sleep", {"steps": 3}, headers={"Idempotency-Key": key}), 422)
    assert list(reused["errors"]) == ["Idempotency-Key"]  # a header key reused for another request (IETF draft)
    differ = assert_problem(api.submit("demo.sleep", {}, dedup_key=key, headers={"Idempotency-Key": "other"}), 422)
    assert "dedup_key" in differ["errors"]


# -- rejected submits ---------------------------------------------------------------------------------


def test_malformed_bodies_are_400_415_413_and_store_nothing(api: Api) -> None:
    before = task_count(api)
    json_type = {"Content-Type": "application/json"}
    assert_problem(api.post(TASKS, data=b'{"type": "demo.sleep",', headers=json_type), 400)
    assert_problem(api.post(TASKS, data=b"\xff\xfe", headers=json_type), 400)
    for not_object in (b'["demo.sleep"]', b'"demo.sleep"', b"42", b"null"):
        assert_problem(api.post(TASKS, data=not_object, headers=json_type), 400)
    body = b'{"type": "demo.sleep", "payload": {}}'
    assert_problem(api.post(TASKS, data=body, headers={"Content-Type": "text/plain"}), 415)
    assert_problem(api.post(TASKS, data=body), 415)  # no content type at all
    big = {"type": "user.echo", "payload": {"text": "x" * (MAX_BODY + 1)}}
    too_large = assert_problem(api.post(TASKS, json=big), 413)
    assert str(MAX_BODY) in too_large["detail"]
    assert task_count(api) == before


@pytest.mark.parametrize("body, field", [
    ({"payload": {}}, "type"),
    ({"type": 5, "payload": {}}, "type"),
    ({"type": "demo.sleep", "payload": []}, "payload"),
    ({"type": "demo.sleep", "payload": {}, "priority": "urgent"}, "priority"),
    ({"type": "demo.sleep", "payload": {}, "dedup_key": "k" * 129}, "dedup_key"),
    ({"type": "demo.sleep", "payload": {}, "colour": "red"}, "colour"),
    ({"type": "demo.sleep", "payload": {"seconds": -1}}, "payload.seconds"),
    ({"type": "orders.split", "payload": {"order_code": "O", "items": [{"item_code": "A", "quantity": "two"}]}},
     "payload.items.0.quantity"),
    ({"type": "orders.split", "payload": {"order_code": "O", "items": [
        {"item_code": "A", "quantity": 1}, {"quantity": 1}]}}, "payload.items.1.item_code"),
    ({"type": "orders.split", "payload": {"order_code": "", "items": []}}, "payload.order_code"),
    ({"type": "orders.export", "payload": {"rows": 10, "format": "pdf"}}, "payload.format"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_invalid_submits_are_422_with_the_field_path(api: Api, body: dict[str, Any], field: str) -> None:
    before = task_count(api)
    problem = assert_problem(api.post(TASKS, json=body), 422)
    assert field in problem["errors"], problem
    assert all(isinstance(m, str) for messages in problem["errors"].values() for m in messages)
    assert task_count(api) == before


def test_unknown_type_is_422_listing_the_known_types(api: Api) -> None:
    problem = assert_problem(api.submit("orders.teleport", {}), 422)
    assert "type" in problem["errors"]
    assert {"demo.sleep", "orders.split", "orders.export", "user.echo"} <= set(problem["known_types"])
    assert "orders.split" in problem["errors"]["type"][0]


# -- lookups ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("task_id", [str(uuid.uuid4()), "not-a-uuid", "1", "00000000-0000-0000-0000-00000000000g"])
def test_unknown_and_malformed_ids_are_404_everywhere(api: Api, task_id: str) -> None:
    for method, suffix in (("GET", ""), ("GET", "/result"), ("GET", "/result/file"), ("GET", "/events"),
                           ("DELETE", "")):
        body = assert_problem(api.request(method, f"{TASKS}/{task_id}{suffix}"), 404)
        assert body["detail"] == "task not found or expired", (method, suffix, body)


def test_with_api_keys_401_without_a_key_and_404_for_someone_elses_task(side_stack: Callable[..., Any]) -> None:
    keyed, _ = side_stack(api_keys="ka:alice,kb:bob")
    keyed.start_web()
    with Api(keyed.base_url, "ka") as alice, Api(keyed.base_url, "kb") as bob, Api(keyed.base_url) as nobody, \
            Api(keyed.base_url, "wrong") as stranger:
        for client in (nobody, stranger):
            for response in (client.submit("demo.sleep", {}), client.get(f"{TASKS}/{uuid.uuid4()}"),
                             client.get(TASKS)):
                assert_problem(response, 401)
                assert response.headers["WWW-Authenticate"].startswith("Bearer")
        task_id = alice.create("demo.sleep", {})
        assert alice.status(task_id)["status"] == "PENDING"
        unknown = bob.get(f"{TASKS}/{uuid.uuid4()}").json()
        for method, suffix in (("GET", ""), ("GET", "/result"), ("GET", "/events"), ("DELETE", "")):
            assert assert_problem(bob.request(method, f"{TASKS}/{task_id}{suffix}"), 404) == unknown
        assert [t["task_id"] for t in alice.get(TASKS).json()["tasks"]] == [task_id]
        assert bob.get(TASKS).json() == {"tasks": [], "next_cursor": None}
        assert alice.status(task_id)["status"] == "PENDING"  # bob's DELETE changed nothing
        assert nobody.get("/healthz").status_code == 200


def test_a_task_past_its_result_time_is_410(side_stack: Callable[..., Any]) -> None:
    short, _ = side_stack(result_ttl=1)
    short.start_web()
    short.start_worker()
    with Api(short.base_url) as client:
        task_id = client.create("demo.sleep", {})
        done = client.wait_for(task_id, "COMPLETED")
        # a Response of 4xx is falsy: wait for a list holding it
        [gone] = wait_until(lambda: [r] if (r := client.get(f"{TASKS}/{task_id}")).status_code == 410 else None,
                            timeout=30, message="the status to answer 410")
        assert gone.headers["Content-Type"].startswith("application/json")
        doc = gone.json()
        assert_document(doc, task_id)
        assert doc["status"] == "EXPIRED" and "result" not in doc
        assert doc["expires_at"] > done["completed_at"]
        result = client.get(f"{TASKS}/{task_id}/result")
        assert result.status_code == 410 and result.json()["status"] == "EXPIRED" and "result" not in result.json()
        assert client.get(f"{TASKS}/{task_id}/events").status_code == 410
        assert assert_problem(client.delete(f"{TASKS}/{task_id}"), 409)["task_status"] == "EXPIRED"


# -- result files -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt, rows", [("csv", 2500), ("xlsx", 300)])
def test_export_file_downloads_as_an_attachment(api: Api, fmt: str, rows: int) -> None:
    task_id = api.create("orders.export", {"rows": rows, "format": fmt, "start_date": "2026-03-01",
                                           "end_date": "2026-03-31"})
    api.wait_for(task_id, "COMPLETED")
    result = api.get(f"{TASKS}/{task_id}/result").json()["result"]
    file = result["file"]
    assert result["rows"] == rows
    assert file["name"] == f"orders_2026-03-01_2026-03-31.{fmt}"
    assert file["url"] == f"{TASKS}/{task_id}/result/file"
    response = api.get(file["url"])
    assert response.status_code == 200
    disposition = response.headers["Content-Disposition"]
    assert disposition.startswith("attachment") and file["name"] in disposition
    assert response.headers["Content-Type"].startswith(file["content_type"].split(";")[0])
    assert len(response.content) == file["size"]
    if fmt == "csv":
        lines = response.content.decode().splitlines()
        assert len(lines) == rows + 1 and lines[0].split(",") == EXPORT_HEADER
        assert lines[1].startswith("ORD-0000001,2026-03-01,") and ",2026-03-31," in lines[-1]
    else:
        book = openpyxl.load_workbook(io.BytesIO(response.content), read_only=True)
        try:
            values = list(book.worksheets[0].values)
        finally:
            book.close()
        assert len(values) == rows + 1 and list(values[0]) == EXPORT_HEADER
        assert values[1][0] == "ORD-0000001"


def test_result_file_of_a_result_without_a_file_is_404(api: Api) -> None:
    task_id = api.create("orders.split", order(f"O-{unique()}"))
    api.wait_for(task_id, "COMPLETED")
    assert_problem(api.get(f"{TASKS}/{task_id}/result/file"), 404)


# -- history ----------------------------------------------------------------------------------------


def test_history_pages_newest_first_and_filters(api: Api) -> None:
    made = []
    for i in range(5):
        made.append(api.create("user.echo", {"text": f"history {unique()} {i}"}))
        api.wait_for(made[-1], "COMPLETED")
    pending = api.create("demo.sleep", {"seconds": 5, "steps": 50}, dedup_key=unique())
    try:
        seen: list[str] = []
        cursor = None
        pages = 0
        while True:
            params = {"type": "user.echo", "limit": 2, **({"cursor": cursor} if cursor else {})}
            response = api.get(TASKS, params=params)
            assert response.status_code == 200, response.text
            page = response.json()
            assert set(page) == {"tasks", "next_cursor"} and len(page["tasks"]) <= 2
            for doc in page["tasks"]:
                assert_document(doc)
                assert doc["type"] == "user.echo"
            seen += [doc["task_id"] for doc in page["tasks"]]
            pages += 1
            if not (cursor := page["next_cursor"]):
                break
        assert seen == made[::-1] and pages == 3
        completed = api.get(TASKS, params={"type": "user.echo", "status": "COMPLETED", "limit": 200}).json()
        assert [t["task_id"] for t in completed["tasks"]] == made[::-1]
        api.wait_for(pending, "PROCESSING")
        active = api.get(TASKS, params={"status": "PROCESSING", "limit": 200}).json()["tasks"]
        assert [t["task_id"] for t in active] == [pending]
        assert api.get(TASKS, params={"type": "user.echo", "status": "FAILED"}).json() == {
            "tasks": [], "next_cursor": None}
        newest = api.get(TASKS, params={"limit": 1}).json()["tasks"]
        assert [t["task_id"] for t in newest] == [pending]
    finally:
        assert api.delete(f"{TASKS}/{pending}").status_code == 204


@pytest.mark.parametrize("query", [
    {"limit": 0}, {"limit": 500}, {"limit": "ten"}, {"status": "DONE"}, {"cursor": "!!garbage!!"}, {"colour": "x"}])
def test_history_rejects_bad_query_parameters_with_422(api: Api, query: dict[str, Any]) -> None:
    problem = assert_problem(api.get(TASKS, params=query), 422)
    assert next(iter(query)) in problem["errors"], problem


# -- live progress ----------------------------------------------------------------------------------


def read_events(response: requests.Response) -> list[dict[str, Any]]:
    """Every event of an SSE stream until the server ends it ("data" parsed as JSON)."""
    events: list[dict[str, Any]] = []
    current: dict[str, Any] = {}
    for raw in response.iter_lines(chunk_size=1):
        line = raw.decode()
        if not line:
            if current:
                events.append(current)
            current = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            current[name] = value.removeprefix(" ")
    for event in events:
        event["data"] = json.loads(event["data"])
    return events


def test_events_stream_starts_with_the_snapshot_and_ends_after_completion(api: Api) -> None:
    task_id = api.create("demo.sleep", {"seconds": 0.6, "steps": 3}, dedup_key=unique())
    # the read timeout only bounds a failure: the stream is silent (no keep-alive before 15 s) until the
    # module's one worker, maybe still ending the previous test's cancelled run, starts the task
    with api.get(f"{TASKS}/{task_id}/events", stream=True, timeout=(3, 30)) as response:
        assert response.status_code == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = read_events(response)  # returns only when the server ends the stream
    assert len(events) >= 2, events
    assert all(e["event"] == "status" for e in events)
    ids = [int(e["id"]) for e in events]
    assert ids == sorted(set(ids)), ids
    docs = [e["data"] for e in events]
    for doc in docs:
        assert_document(doc, task_id)
    assert docs[0]["status"] in ("PENDING", "PROCESSING")
    assert docs[-1]["status"] == "COMPLETED" and docs[-1]["progress"] == 100
    assert "COMPLETED" not in [d["status"] for d in docs[:-1]]
    progress = [d["progress"] for d in docs]
    assert progress == sorted(progress)

    resume = {"Last-Event-ID": str(ids[0])}
    with api.get(f"{TASKS}/{task_id}/events", stream=True, timeout=(3, 30), headers=resume) as response:
        replay = read_events(response)
    assert replay and all(int(e["id"]) > ids[0] for e in replay)
    assert replay[-1]["data"]["status"] == "COMPLETED"


# -- outside /api/v1 --------------------------------------------------------------------------------


def test_health_openapi_and_metrics(api: Api) -> None:
    health = api.get("/healthz")
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    ready = api.get("/readyz")  # no scheduler in this stack: degraded (503), with Redis and the worker reported
    assert ready.status_code == 503 and ready.json()["store"] == "ok" and min(ready.json()["workers"].values()) >= 1
    spec = api.get("/api/v1/openapi.json")
    assert spec.status_code == 200 and spec.headers["Content-Type"].startswith("application/json")
    document = spec.json()
    assert document["openapi"].startswith("3.")
    assert {"/api/v1/tasks", "/api/v1/tasks/{task_id}"} <= set(document["paths"]), sorted(document["paths"])
    metrics = api.get("/metrics")
    assert metrics.status_code == 200 and metrics.headers["Content-Type"].startswith("text/plain")
    assert "taskport_http_requests_total" in metrics.text and "taskport_redis_up 1.0" in metrics.text
    assert_problem(api.get("/api/v1/no-such-thing"), 404)
    assert_problem(api.request("PUT", TASKS), 405)


def test_redis_down_is_503_with_retry_after_quickly_then_ready_again(side_stack: Callable[..., Any]) -> None:
    outage, server = side_stack()
    outage.start_web()
    with Api(outage.base_url) as client:
        task_id = client.create("demo.sleep", {})
        assert client.get("/readyz").json()["store"] == "ok"  # degraded (no worker), but Redis answers
        server.stop()
        ready = client.get("/readyz")
        assert_problem(ready, 503)
        assert int(ready.headers["Retry-After"]) > 0
        for method, path, kwargs in (("GET", f"{TASKS}/{task_id}", {}),
                                     ("POST", TASKS, {"json": {"type": "demo.sleep", "payload": {}}}),
                                     ("GET", TASKS, {}), ("DELETE", f"{TASKS}/{task_id}", {})):
            started = time.monotonic()
            response = client.request(method, path, **kwargs)
            elapsed = time.monotonic() - started
            assert_problem(response, 503)
            assert int(response.headers["Retry-After"]) > 0
            assert elapsed < 3, (method, path, elapsed)
        assert client.get("/healthz").status_code == 200  # the process itself is fine
        server.start()
        wait_until(lambda: client.get("/readyz").json().get("store") == "ok", timeout=30, message="/readyz to recover")
        assert client.status(task_id)["status"] == "PENDING"
