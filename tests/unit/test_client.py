"""The Python client's own logic against a scripted transport (httpx.MockTransport): settings, problem
mapping, Retry-After, limits, stream resume and fallback. The real stack: tests/integration/test_clients.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from taskport import (
    Client,
    ClientSettings,
    Conflict,
    InvalidRequest,
    ServiceUnreachable,
    StillRunning,
    TaskFailed,
    Unauthorized,
    Unavailable,
)
from taskport.cli import exit_code
from taskport.errors import NotFound, TooManyRequests

REPO_ROOT = Path(__file__).resolve().parents[2]
TID = "2f1c6a0e-8a53-4c1e-9d6b-0b2a4c1f7e21"


def doc(status: str = "PROCESSING", progress: int = 10, **extra: Any) -> dict[str, Any]:
    return {"task_id": TID, "type": "demo.sleep", "status": status, "progress": progress, "message": "",
            "items": None, "error": None, **extra}


def problem(status: int, **extra: Any) -> httpx.Response:
    body = {"type": "/problems/x", "title": "Title", "status": status, "detail": "detail", **extra}
    return httpx.Response(status, json=body, headers={"Content-Type": "application/problem+json"})


class Script:
    """Answers requests from a list of callables (or responses), recording every request."""

    def __init__(self, *answers: httpx.Response | Callable[[httpx.Request], httpx.Response]) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        return answer(request) if callable(answer) else answer


@pytest.fixture
def naps() -> list[float]:
    return []


def make(script: Script, naps: list[float], **kwargs: Any) -> Client:
    return Client("http://tp.test/", "k1", transport=httpx.MockTransport(script), sleep=naps.append, **kwargs)


def test_settings_come_from_the_two_variables_only() -> None:
    assert ClientSettings.from_env({}) == ClientSettings("http://127.0.0.1:8000", None)
    env = {"TASKPORT_URL": " https://tp.example/ ", "TASKPORT_API_KEY": "secret", "PORT": "1"}
    assert ClientSettings.from_env(env) == ClientSettings("https://tp.example", "secret")
    assert ClientSettings.from_env({"TASKPORT_URL": "", "TASKPORT_API_KEY": " "}).api_key is None


def test_the_client_imports_without_flask_redis_or_the_server_packages() -> None:
    blocked = "flask redis rq app.web app.launch workers werkzeug".split()  # app.core.states: see test_imports
    code = ("import sys\n"
            f"for name in {blocked!r}: sys.modules[name] = None  # any import of them now fails\n"
            "import taskport, taskport.client, taskport.cli, taskport.render\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_key_is_sent_and_problems_become_typed_errors(naps: list[float]) -> None:
    script = Script(problem(422, errors={"payload.seconds": ["Not a valid number."]}), problem(401),
                    problem(409, task_status="COMPLETED"), problem(503), httpx.Response(500, text="oops"))
    with make(script, naps) as c:
        with pytest.raises(InvalidRequest) as invalid:
            c.submit("demo.sleep", {"seconds": "x"}, idempotency_key="k", priority="high")
        with pytest.raises(Unauthorized):
            c.status(TID)
        with pytest.raises(Conflict) as conflict:
            c.cancel(TID)
        with pytest.raises(Unavailable):
            c.status(TID)
        with pytest.raises(Exception) as other:
            c.status(TID)
    sent = script.requests[0]
    assert sent.headers["Authorization"] == "Bearer k1" and sent.headers["Idempotency-Key"] == "k"
    assert json.loads(sent.content) == {"type": "demo.sleep", "payload": {"seconds": "x"}, "priority": "high"}
    assert invalid.value.errors == {"payload.seconds": ["Not a valid number."]}
    assert str(invalid.value) == "422 Title: detail (payload.seconds: Not a valid number.)"
    assert conflict.value.task_status == "COMPLETED"
    assert getattr(other.value, "status", None) == 500


def test_an_unreachable_service_is_one_readable_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    with Client("http://tp.test", transport=httpx.MockTransport(refuse)) as c, pytest.raises(ServiceUnreachable) as e:
        c.status(TID)
    assert str(e.value) == "no answer from http://tp.test: ConnectError: connection refused"


def test_wait_polls_as_retry_after_says_then_fetches_the_result(naps: list[float]) -> None:
    result = {"task_id": TID, "status": "COMPLETED", "result": {}, "failures": [], "error_code": None, "items": None}
    script = Script(httpx.Response(200, json=doc(), headers={"Retry-After": "3"}),
                    httpx.Response(200, json=doc(progress=50)),  # no Retry-After: the default second
                    httpx.Response(200, json=doc("COMPLETED", 100)), httpx.Response(200, json=result))
    seen: list[int] = []
    with make(script, naps) as c:
        assert c.wait(TID, on_update=lambda d: seen.append(d["progress"])) == result
    assert naps == [3.0, 1.0] and seen == [10, 50, 100]
    assert [r.url.path for r in script.requests][-1] == f"/api/v1/tasks/{TID}/result"


def test_wait_rides_out_a_503_and_raises_the_failure_code(naps: list[float]) -> None:
    failed = doc("FAILED", 40, error={"code": 10001, "message": "bill unpaid"})
    script = Script(problem(503), httpx.Response(200, json=failed))
    script.answers[0].headers["Retry-After"] = "5"
    with make(script, naps) as c, pytest.raises(TaskFailed) as e:
        c.wait(TID)
    assert (e.value.code, e.value.message, naps) == (10001, "bill unpaid", [5.0])


def test_max_attempts_raises_still_running_without_a_last_wait(naps: list[float]) -> None:
    script = Script(*(httpx.Response(200, json=doc(), headers={"Retry-After": "1"}) for _ in range(2)))
    with make(script, naps) as c, pytest.raises(StillRunning) as e:
        c.wait(TID, max_attempts=2)
    assert e.value.attempts == 2 and naps == [1.0] and "check its status or the history later" in str(e.value)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_timeout_cuts_the_wait_short() -> None:
    clock = Clock()
    script = Script(*(httpx.Response(200, json=doc(), headers={"Retry-After": "4"}) for _ in range(3)))
    with Client("http://tp.test", transport=httpx.MockTransport(script), sleep=clock.sleep, clock=clock) as c:
        with pytest.raises(StillRunning):
            c.wait(TID, timeout=5)
    assert clock.now == 5.0 and len(script.requests) == 2  # slept 4, then only the 1 s left


def sse(*events: tuple[int, dict[str, Any]], broken: bool = False,
        name: str = "status") -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        def body() -> Iterator[bytes]:
            for seq, d in events:
                yield f"event: {name}\nid: {seq}\ndata: {json.dumps(d)}\n\n".encode()
            if broken:
                raise httpx.RemoteProtocolError("peer closed connection")

        return httpx.Response(200, headers={"Content-Type": "text/event-stream"}, stream=IterStream(body()))

    return answer


class IterStream(httpx.SyncByteStream):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        return self.chunks


def test_events_resume_after_a_drop_with_last_event_id(naps: list[float]) -> None:
    script = Script(sse((3, doc(progress=10)), (4, doc(progress=20)), broken=True),
                    sse((7, doc("COMPLETED", 100))))
    with make(script, naps) as c:
        events = list(c.events(TID))
    assert [(e.id, e.doc["progress"]) for e in events] == [(3, 10), (4, 20), (7, 100)]
    assert "Last-Event-ID" not in script.requests[0].headers
    assert script.requests[1].headers["Last-Event-ID"] == "4"


def test_follow_falls_back_to_polling_when_the_stream_keeps_failing(naps: list[float]) -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("reset")

    script = Script(*([broken] * 4), httpx.Response(200, json=doc("COMPLETED", 100)))
    with make(script, naps) as c:
        docs = list(c.follow(TID))
    assert docs[-1]["status"] == "COMPLETED"
    assert [r.url.path.rsplit("/", 1)[-1] for r in script.requests] == ["events"] * 4 + [TID]


def test_download_keeps_a_bare_file_name(naps: list[float], tmp_path: Path) -> None:
    script = Script(httpx.Response(200, content=b"a,b\n", headers={
        "Content-Disposition": 'attachment; filename="../../etc/evil.csv"'}))
    with make(script, naps) as c:
        saved = c.download(TID, tmp_path)
    assert saved == tmp_path / "evil.csv" and saved.read_bytes() == b"a,b\n"


@pytest.mark.parametrize(("document", "code"), [
    ({"status": "COMPLETED", "items": None}, 0),
    ({"status": "COMPLETED", "items": {"total": 2, "succeeded": 1, "failed": 1}}, 3),
    ({"status": "COMPLETED", "failures": [{"item": "1", "code": 10001, "message": ""}]}, 3),
    ({"status": "FAILED"}, 4), ({"status": "CANCELLED"}, 5), ({"status": "EXPIRED"}, 6),
    ({"status": "PENDING"}, 7), ({"status": "PROCESSING"}, 7),
])
def test_exit_codes_of_documents(document: dict[str, Any], code: int) -> None:
    assert exit_code(document) == code


def test_the_status_view_shows_resumed_only_when_a_run_resumed() -> None:
    from rich.console import Console

    from taskport import render

    def shown(document: dict[str, Any]) -> list[str]:
        console = Console(record=True, width=200)
        render.status(document, console)
        return console.export_text().splitlines()

    fresh = shown(doc(attempts=1, resumed=0))
    assert fresh[:3] == [f"task      {TID}", "type      demo.sleep", "status    PROCESSING"]
    assert not any(line.startswith("resumed") for line in fresh)
    assert not any(line.startswith("resumed") for line in shown(doc()))  # a document without the field
    assert "resumed   1 time from a checkpoint" in shown(doc(attempts=1, resumed=1))
    assert "resumed   3 times from a checkpoint" in shown(doc("COMPLETED", 100, attempts=1, resumed=3))


# -- batches (taskport/batches.py) -------------------------------------------------------------------------

BID = "7d0c1f52-6b1e-4f7a-9a43-2b6e0c9d1a10"


def batch_doc(status: str = "RUNNING", progress: int = 0, **extra: Any) -> dict[str, Any]:
    counts = {"PENDING": 2, "PROCESSING": 0, "COMPLETED": 0, "FAILED": 0, "CANCELLED": 0, "EXPIRED": 0}
    if status == "DONE":
        counts.update(PENDING=0, COMPLETED=2)
    return {"batch_id": BID, "size": 2, "status": status, "counts": counts, "progress": progress,
            "items": {"total": 0, "succeeded": 0, "failed": 0}, "then_task_id": None, "callback": None, **extra}


def test_submit_batch_sends_the_contract_body_and_submit_a_callback(naps: list[float]) -> None:
    accepted = batch_doc(tasks=[{"task_id": TID, "status": "PENDING", "duplicate": False},
                                {"task_id": "t2", "status": "COMPLETED", "duplicate": True}])
    script = Script(httpx.Response(202, json=accepted, headers={"Location": f"/api/v1/batches/{BID}"}),
                    httpx.Response(202, json=doc("PENDING", 0)))
    tasks = ({"type": "demo.sleep", "payload": {"seconds": n}} for n in (1, 2))  # any iterable of submit bodies
    with make(script, naps) as c:
        assert c.submit_batch(tasks, then={"type": "demo.sleep", "payload": {}},
                              callback="https://hooks.example/tp") == accepted
        c.submit("demo.sleep", {}, callback={"url": "https://hooks.example/tp", "events": ["FAILED"]})
    sent, single = script.requests
    assert (sent.method, sent.url.path) == ("POST", "/api/v1/batches")
    assert json.loads(sent.content) == {
        "tasks": [{"type": "demo.sleep", "payload": {"seconds": 1}}, {"type": "demo.sleep", "payload": {"seconds": 2}}],
        "then": {"type": "demo.sleep", "payload": {}}, "callback": {"url": "https://hooks.example/tp"}}
    assert json.loads(single.content)["callback"] == {"url": "https://hooks.example/tp", "events": ["FAILED"]}


def test_a_bad_batch_names_the_task_by_index_the_cap_is_too_many_requests_and_unknown_is_not_found(
        naps: list[float]) -> None:
    cap = problem(429, detail="at most 500 active tasks")
    cap.headers["Retry-After"] = "5"
    script = Script(problem(422, errors={"tasks.3.payload.items.0.quantity": ["Must be at least 1."]}), cap,
                    problem(404), problem(404))
    with make(script, naps) as c:
        with pytest.raises(InvalidRequest) as invalid:
            c.submit_batch([{"type": "orders.split", "payload": {}}] * 4)
        with pytest.raises(TooManyRequests) as throttled:
            c.submit_batch([{"type": "demo.sleep", "payload": {}}])
        with pytest.raises(NotFound):
            c.batch("nope")
        with pytest.raises(NotFound):
            c.cancel_batch("nope/../x")
    assert invalid.value.errors == {"tasks.3.payload.items.0.quantity": ["Must be at least 1."]}
    assert throttled.value.retry_after == 5.0 and throttled.value.status == 429
    assert script.requests[3].method == "DELETE" and script.requests[3].url.raw_path.endswith(b"/nope%2F..%2Fx")


def test_batch_tasks_pages_in_order_with_the_status_filter(naps: list[float]) -> None:
    script = Script(httpx.Response(200, json={"tasks": [doc(task_id="a"), doc(task_id="b")], "next_cursor": "c1"}),
                    httpx.Response(200, json={"tasks": [doc(task_id="c")], "next_cursor": None}))
    with make(script, naps) as c:
        assert [d["task_id"] for d in c.batch_tasks(BID, "FAILED", page_size=2)] == ["a", "b", "c"]
    assert [r.url.path for r in script.requests] == [f"/api/v1/batches/{BID}/tasks"] * 2
    assert [dict(r.url.params) for r in script.requests] == [{"limit": "2", "status": "FAILED"},
                                                             {"limit": "2", "status": "FAILED", "cursor": "c1"}]


def test_watch_batch_resumes_with_last_event_id_and_ends_at_done(naps: list[float]) -> None:
    script = Script(sse((1, batch_doc()), (2, batch_doc(progress=50)), broken=True, name="batch"),
                    sse((5, batch_doc("DONE", 100)), name="batch"))
    with make(script, naps) as c:
        docs = list(c.watch_batch(BID))
    assert [(d["status"], d["progress"]) for d in docs] == [("RUNNING", 0), ("RUNNING", 50), ("DONE", 100)]
    assert [r.url.path for r in script.requests] == [f"/api/v1/batches/{BID}/events"] * 2
    assert "Last-Event-ID" not in script.requests[0].headers and script.requests[1].headers["Last-Event-ID"] == "2"


def test_watch_batch_polls_when_the_stream_cannot_open_and_cancel_sends_delete(naps: list[float]) -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("reset")

    script = Script(*([broken] * 4), httpx.Response(200, json=batch_doc(progress=50)),
                    httpx.Response(200, json=batch_doc("DONE", 100)), httpx.Response(204))
    with make(script, naps) as c:
        assert [d["status"] for d in c.watch_batch(BID)] == ["RUNNING", "DONE"]
        c.cancel_batch(BID)
    assert [r.url.path.rsplit("/", 1)[-1] for r in script.requests] == ["events"] * 4 + [BID, BID, BID]
    assert naps[-1] == 1.0 and script.requests[-1].method == "DELETE"


def test_watch_batch_at_its_limit_is_still_running_for_the_batch() -> None:
    clock = Clock()
    script = Script(*(httpx.Response(200, json=batch_doc()) for _ in range(3)))
    with Client("http://tp.test", transport=httpx.MockTransport(script), sleep=clock.sleep, clock=clock) as c:
        with pytest.raises(StillRunning) as e:
            list(c.watch_batch(BID, timeout=2.5, sse=False))
    assert e.value.kind == "batch" and e.value.task_id == BID
    assert str(e.value).startswith(f"batch {BID} is still RUNNING (0%) after 3 attempts: check its status later")
