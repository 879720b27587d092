"""A task's live output on fakeredis: EMIT's fence, trim and quota; the reads; ctx.emit; GET /tasks/{id}/output."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest

from app.core import keys
from app.core.answers import NewTask
from app.core.clock import iso, now_ms
from app.core.config import Config
from app.core.output import MARKER, OutputLog, encode, split
from app.core.rerun import rerun
from app.core.results import LocalResultStore
from app.core.store import TaskStore
from workers.context import TaskContext
from workers.exceptions import TaskCancelled
from workers.outputbuffer import OUTPUT_INTERVAL


def started(store: TaskStore, run_id: str = "r1", member: str = "public") -> str:
    task_id = str(uuid.uuid4())
    store.create(NewTask(task_id=task_id, member=member, type="demo.sleep", payload={"seconds": 0},
                         dedup_digest=task_id, priority="default", max_attempts=1))
    assert store.start(task_id, run_id).started is not None
    return task_id


def texts(log: OutputLog, task_id: str, after: int = 0) -> list[tuple[int, str]]:
    return [(line.id, line.text) for line in log.page(task_id, after).lines]


def stored(store: TaskStore, task_id: str) -> tuple[int, int]:
    """(the task's STORED field, its member's sum)."""
    return (int(store.redis.hget(keys.task(task_id), keys.TaskField.STORED) or 0),
            int(store.redis.hget(keys.STORED_BYTES, "public") or 0))


def test_lines_get_increasing_ids_and_a_page_reads_after_one(store: TaskStore) -> None:
    log = OutputLog(store)
    task_id = started(store)
    assert log.emit(task_id, "r1", [encode(1, "a"), encode(2, "b")], now_ms()) == "PROCESSING"
    assert log.emit(task_id, "r1", [encode(3, "c")], now_ms()) == "PROCESSING"
    assert texts(log, task_id) == [(1, "a"), (2, "b"), (3, "c")]
    assert texts(log, task_id, after=2) == [(3, "c")]
    page = log.page(task_id, 1, limit=1)
    assert [line.id for line in page.lines] == [2] and page.last == 3 and page.status == "PROCESSING"
    assert log.page(task_id, 0).lines[0].at == 1


def test_a_run_that_does_not_hold_the_task_adds_nothing(store: TaskStore) -> None:
    log = OutputLog(store)
    task_id = started(store)
    assert log.emit(task_id, "someone-else", [encode(1, "late")], now_ms()) == "TAKEN"
    store.cancel(task_id)
    assert log.emit(task_id, "r1", [encode(1, "late")], now_ms()) == "CANCELLED"
    assert texts(log, task_id) == [] and log.page(task_id, 0).last == 0


def test_the_oldest_lines_are_trimmed_at_the_cap_and_the_quota_follows(conn, tmp_path: Path) -> None:
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, output_max_lines=3)
    store = TaskStore(conn, config)
    log = OutputLog(store)
    task_id = started(store)
    payload_bytes = stored(store, task_id)[0]
    lines = [encode(1000 + i, f"line {i}") for i in range(1, 6)]
    log.emit(task_id, "r1", lines[:2], now_ms())
    log.emit(task_id, "r1", lines[2:], now_ms())
    assert texts(log, task_id) == [(3, "line 3"), (4, "line 4"), (5, "line 5")]
    assert texts(log, task_id, after=1) == [(3, "line 3"), (4, "line 4"), (5, "line 5")]  # 2 is gone: the oldest kept
    held = sum(len(line) for line in lines[2:])
    assert log.held(task_id) == (3, held)
    assert stored(store, task_id) == (payload_bytes + held, payload_bytes + held)


def test_output_stays_with_a_finished_task_and_goes_with_its_expiry(store: TaskStore) -> None:
    log = OutputLog(store)
    task_id = started(store)
    log.emit(task_id, "r1", [encode(1, "kept")], now_ms())
    assert store.complete(task_id, "r1", {"ok": 1}, items=None, failures=[], error_code=None)
    assert texts(log, task_id) == [(1, "kept")]
    hash_ttl, output_ttl = store.redis.ttl(keys.task(task_id)), store.redis.ttl(keys.output(task_id))
    assert abs(hash_ttl - output_ttl) <= 1  # lives as long as the task's hash
    assert store.expire_batch([task_id], now_ms() + store.config.result_ttl * 1000 + 1)
    assert store.redis.exists(keys.output(task_id)) == 0
    assert stored(store, task_id) == (0, 0)  # the tombstone holds nothing: payload, result and output gone


def test_run_again_empties_the_output_and_ids_keep_going_up(store: TaskStore) -> None:
    from app.core.jobs import JobQueue, rerun_job_id

    log = OutputLog(store)
    task_id = started(store)
    log.emit(task_id, "r1", [encode(1, "first run")], now_ms())
    store.fail(task_id, "r1", 7, "no")
    job = rerun_job_id(task_id, 1)
    rerun(store, task_id, job, JobQueue(store.redis, store.config).job_commands(task_id, "default", 60, job), 1)
    assert texts(log, task_id) == [] and log.held(task_id) == (0, 0)
    assert store.start(task_id, "r2").started is not None
    log.emit(task_id, "r2", [encode(2, "second run")], now_ms())
    assert texts(log, task_id) == [(2, "second run")]
    assert stored(store, task_id)[1] == stored(store, task_id)[0]


def test_split_makes_one_line_per_newline_and_cuts_long_ones() -> None:
    assert split("a\nb\r\n", 10) == ["a", "b"]
    assert split("", 10) == [""]
    assert split("x" * 20, 10) == ["x" * (10 - len(MARKER.encode())) + MARKER]
    cut = split("é" * 10, 8)[0]  # never half a character
    assert cut.endswith(MARKER) and len(cut.encode()) <= 8


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_ctx_emit_writes_at_once_then_batches_within_the_interval(tmp_path: Path) -> None:
    sent: list[list[bytes]] = []
    clock = Clock()

    def emit(lines: list[bytes], skipped: int) -> str:
        sent.append(lines)
        return "PROCESSING"

    ctx = TaskContext("t", lambda *a: "PROCESSING", results=LocalResultStore(tmp_path), clock=clock, emit=emit)
    ctx.emit("one")
    ctx.emit("two\nthree")
    assert [len(batch) for batch in sent] == [1]
    clock.now += OUTPUT_INTERVAL
    ctx.emit("four")
    assert [[line.split(b":", 1)[1] for line in batch] for batch in sent] == [[b"one"], [b"two", b"three", b"four"]]
    ctx.emit("five")
    ctx.flush()  # the heartbeat's flush (and the run's end) writes what waits
    assert sent[-1][0].endswith(b":five")


def test_ctx_emit_of_a_run_that_lost_the_task_raises_at_the_cancellation_point(tmp_path: Path) -> None:
    ctx = TaskContext("t", lambda *a: "PROCESSING", results=LocalResultStore(tmp_path),
                      emit=lambda lines, skipped: "TAKEN")
    with pytest.raises(TaskCancelled):
        ctx.emit("late")


def test_a_failed_write_keeps_its_lines_for_the_next(tmp_path: Path) -> None:
    answers = iter([ConnectionError("down"), "PROCESSING"])
    sent: list[list[bytes]] = []

    def emit(lines: list[bytes], skipped: int) -> str:
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        sent.append(lines)
        return answer

    ctx = TaskContext("t", lambda *a: "PROCESSING", results=LocalResultStore(tmp_path), emit=emit)
    ctx.emit("kept")
    ctx.flush_output()
    assert len(sent) == 1 and sent[0][0].endswith(b":kept")


# -- the route ---------------------------------------------------------------------------------


def test_get_output_pages_with_after_and_limit_then_next_is_null(app, client, store: TaskStore) -> None:
    log = OutputLog(store)
    task_id = started(store)
    log.emit(task_id, "r1", [encode(1_700_000_000_000, "a"), encode(1_700_000_000_001, "b")], now_ms())
    first = client.get(f"/api/v1/tasks/{task_id}/output?limit=1")
    assert first.status_code == 200
    assert first.json == {"lines": [{"id": "1", "at": iso(1_700_000_000_000), "text": "a"}], "next": "1"}
    second = client.get(f"/api/v1/tasks/{task_id}/output?after=1").json
    assert [line["text"] for line in second["lines"]] == ["b"] and second["next"] == "2"
    assert client.get(f"/api/v1/tasks/{task_id}/output?after=2").json == {"lines": [], "next": "2"}
    store.complete(task_id, "r1", 1, items=None, failures=[], error_code=None)
    assert client.get(f"/api/v1/tasks/{task_id}/output?limit=1").json["next"] == "1"  # 2 is still to serve
    last = client.get(f"/api/v1/tasks/{task_id}/output?after=1").json
    assert [line["text"] for line in last["lines"]] == ["b"] and last["next"] is None  # ended, all served
    assert client.get(f"/api/v1/tasks/{task_id}/output?after=2").json == {"lines": [], "next": None}


@pytest.mark.parametrize(("query", "field"), [("after=x", "after"), ("after=-1", "after"), ("limit=0", "limit"),
                                              ("limit=1001", "limit"), ("after=99999999999999999999", "after"),
                                              ("after=", "after"), ("limit=", "limit"),  # empty: no id (fuzz ST201)
                                              ("after=1000000000000000000", "after")])  # 19 digits: past the pattern
def test_get_output_names_a_bad_query_parameter(client, store: TaskStore, query: str, field: str) -> None:
    task_id = started(store)
    answer = client.get(f"/api/v1/tasks/{task_id}/output?{query}")
    assert answer.status_code == 422 and answer.content_type.startswith("application/problem+json")
    assert list(answer.json["errors"]) == [field]


def test_get_output_of_an_unknown_task_is_404(client) -> None:
    answer = client.get(f"/api/v1/tasks/{uuid.uuid4()}/output")
    assert answer.status_code == 404 and answer.content_type.startswith("application/problem+json")


def test_lines_a_run_dropped_unsent_keep_their_ids(conn, tmp_path: Path) -> None:
    """More lines waiting than the task keeps: the oldest are dropped before the write but still counted, so the
    ids of the lines kept are those of a list that got every line and trimmed it."""
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, output_max_lines=3)
    store = TaskStore(conn, config)
    log = OutputLog(store)
    task_id = started(store)
    log.emit(task_id, "r1", [encode(1, "old 1"), encode(2, "old 2")], now_ms())
    clock = Clock()
    ctx = TaskContext(task_id, lambda *a: "PROCESSING", results=LocalResultStore(tmp_path), clock=clock,
                      emit=lambda lines, skipped: log.emit(task_id, "r1", lines, now_ms(), skipped),
                      output_limits=(3, 100))
    ctx.emit("new 1")  # written at once: 3 lines now
    ctx.emit("new 2\nnew 3\nnew 4\nnew 5")  # waiting: 4 lines, over the 3 kept; "new 2" is dropped unsent
    ctx.flush_output()
    assert texts(log, task_id) == [(5, "new 3"), (6, "new 4"), (7, "new 5")]
    assert log.held(task_id)[1] == sum(len(raw) for raw in conn.lrange(keys.output(task_id), 0, -1))


# -- the event stream --------------------------------------------------------------------------


@pytest.fixture
def app(config, conn):
    import dataclasses

    from app.web import create_app

    return create_app(dataclasses.replace(config, sse_heartbeat=30.0, sse_poll=30.0), conn=conn)


@pytest.fixture
def web_store(app) -> TaskStore:
    from app.web.runtime import EXTENSION

    return app.extensions[EXTENSION].service.store


def sse(client, task_id: str, **headers: str) -> Any:
    response = client.get(f"/api/v1/tasks/{task_id}/events", headers=headers, buffered=False)
    return response, iter(response.response)


def event(chunks: Any) -> tuple[str, str, dict]:
    """(event name, id, data) of the next event (comments skipped)."""
    while (chunk := next(chunks)).startswith(b":"):
        pass
    fields = dict(line.split(": ", 1) for line in chunk.decode().strip().split("\n"))
    return fields["event"], fields["id"], orjson.loads(fields["data"])


def test_a_stream_sends_lines_as_output_events_with_ids_that_resume_both(client, web_store: TaskStore) -> None:
    log = OutputLog(web_store)
    task_id = started(web_store)
    response, chunks = sse(client, task_id)
    try:
        assert event(chunks)[:2] == ("status", "1")  # no line yet: today's ids
        log.emit(task_id, "r1", [encode(1_700_000_000_000, "a"), encode(1_700_000_000_001, "b")], now_ms())
        assert event(chunks) == ("output", "1-1", {"id": "1", "at": iso(1_700_000_000_000), "text": "a"})
        assert event(chunks)[:2] == ("output", "1-2")
        web_store.report(task_id, "r1", 50, "half")
        name, event_id, doc = event(chunks)
        assert (name, event_id, doc["progress"]) == ("status", "2-2", 50)
        log.emit(task_id, "r1", [encode(1, "c")], now_ms())
        web_store.complete(task_id, "r1", 1, items=None, failures=[], error_code=None)
        got = [event(chunks) for _ in range(2)]
        assert [(name, event_id) for name, event_id, _ in got] == [("output", "2-3"), ("status", "3-3")]
        assert list(chunks) == []
    finally:
        response.close()
    # resumed from the middle: the lines after it, and no status (the client has the final one)
    response, chunks = sse(client, task_id, **{"Last-Event-ID": "3-1"})
    try:
        assert [event(chunks)[2]["text"] for _ in range(2)] == ["b", "c"]
        assert list(chunks) == []
    finally:
        response.close()
    # a plain integer: the status as before, and every line kept
    response, chunks = sse(client, task_id, **{"Last-Event-ID": "2"})
    try:
        got = [event(chunks) for _ in range(4)]
        assert [(name, data.get("text")) for name, _, data in got] == [
            ("output", "a"), ("output", "b"), ("output", "c"), ("status", None)]
        assert got[-1][1] == "3-3" and list(chunks) == []
    finally:
        response.close()


@pytest.mark.parametrize("bad", ["1-x", "1-", "-1", "1-2-3", "1-99999999999999999999",
                                 "1-9788113097998108426"])  # 19 digits past 2^63 - 1 (fuzz ST202: the pattern took it)
def test_a_last_event_id_that_no_stream_sent_is_422(client, web_store: TaskStore, bad: str) -> None:
    task_id = started(web_store)
    answer = client.get(f"/api/v1/tasks/{task_id}/events", headers={"Last-Event-ID": bad})
    assert answer.status_code == 422 and list(answer.json["errors"]) == ["Last-Event-ID"]


@pytest.mark.parametrize("variable", ["TASKPORT_OUTPUT_MAX_LINES", "TASKPORT_OUTPUT_MAX_LINE_BYTES"])
def test_the_output_caps_must_be_positive(variable: str) -> None:
    from app.core.config import ConfigError

    with pytest.raises(ConfigError, match=variable):
        Config.from_env({variable: "0"})
