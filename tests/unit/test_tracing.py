"""Tracing (app.core.tracing) in one process, on the SDK's in-memory exporter: a submit's server span, the task's
kept traceparent, its runs' spans in the same trace (a retry's too, told apart by its attempt), and nothing at
all when tracing is off. The same across real processes: tests/integration/test_tracing.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from app.core import keys, tracing
from app.core.config import Config
from app.core.states import TaskStatus
from app.web import create_app
from tests.unit.test_runner import API, PROCESSORS, registering
from workers.endings import COMPLETED
from workers.runner import Runner

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER = f"00-{CALLER_TRACE}-b7ad6b7169203331-01"  # the W3C example: a caller's span


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from registering(monkeypatch, PROCESSORS)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, progress_interval=0,
                           heartbeat_interval=3600, retry_backoff="0")


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    assert tracing.setup("test", env={}, exporter=exporter)
    yield exporter
    tracing.reset()


@pytest.fixture
def traced_client(spans: InMemorySpanExporter, config: Config, conn: Any) -> Any:
    return create_app(config, conn=conn).test_client()  # built once tracing is on: with its middleware


def submit(client: Any, task_type: str, **payload: Any) -> str:
    r = client.post(API, json={"type": task_type, "payload": payload}, headers={"traceparent": CALLER})
    assert r.status_code == 202, r.get_json()
    return str(r.get_json()["task_id"])


def test_the_submit_is_a_server_span_and_its_task_runs_in_its_trace(traced_client, spans, conn, config):
    task_id = submit(traced_client, "rt.echo", text="hi")
    (server,) = spans.get_finished_spans()
    assert server.kind == SpanKind.SERVER and server.name == "POST /api/v1/tasks"
    assert server.parent is not None and server.parent.span_id == 0xB7AD6B7169203331  # the caller's
    assert f"{server.context.trace_id:032x}" == CALLER_TRACE
    assert server.attributes["taskport.task_id"] == task_id and server.attributes["http.response.status_code"] == 202
    kept = conn.hget(keys.task(task_id), keys.TaskField.TRACEPARENT).decode()
    assert kept == f"00-{CALLER_TRACE}-{server.context.span_id:016x}-01"

    assert Runner(config, conn).run(task_id) == COMPLETED
    run = spans.get_finished_spans()[-1]
    assert run.name == "run rt.echo" and run.kind == SpanKind.CONSUMER
    assert run.context.trace_id == server.context.trace_id and run.parent.span_id == server.context.span_id
    assert run.attributes["taskport.task_id"] == task_id and run.attributes["taskport.attempt"] == 1
    assert run.attributes["taskport.outcome"] == "completed" and run.attributes["taskport.resumed"] is False


def test_a_retry_is_a_second_run_span_under_the_same_submit_with_its_attempt(traced_client, spans, conn, config):
    task_id = submit(traced_client, "rt.flaky")  # one retry, at once (retry_backoff 0)
    runner = Runner(config, conn)
    assert runner.run(task_id) is None  # retried
    end = runner.run(task_id)
    assert end is not None and end.status == TaskStatus.FAILED
    server, first, second = spans.get_finished_spans()
    assert {first.parent.span_id, second.parent.span_id} == {server.context.span_id}
    assert [first.attributes["taskport.attempt"], second.attributes["taskport.attempt"]] == [1, 2]
    assert first.attributes["taskport.outcome"] == "not ended" and first.status.status_code == StatusCode.UNSET
    assert second.attributes["taskport.outcome"] == "failed" and second.status.status_code == StatusCode.ERROR


def test_off_by_default_no_middleware_no_field_no_span(client, conn, config):
    assert not tracing.ON
    assert not isinstance(client.application.wsgi_app, tracing.Middleware)
    r = client.post(API, json={"type": "rt.echo", "payload": {"text": "x"}}, headers={"traceparent": CALLER})
    task_id = r.get_json()["task_id"]
    assert conn.hget(keys.task(task_id), keys.TaskField.TRACEPARENT) is None
    assert tracing.run_span(CALLER, task_id, "rt.echo", "r", 1, False).__enter__() is None


@pytest.mark.parametrize(("env", "wanted"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x"}, False),  # a name alone exports nothing
    ({"OTEL_TRACES_EXPORTER": "none"}, False),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
])
def test_only_otel_variables_that_ask_for_traces_turn_it_on(env, wanted):
    assert tracing.wanted(env) is wanted


def test_a_batch_s_tasks_keep_the_batch_request_s_span(traced_client, spans, conn):
    r = traced_client.post("/api/v1/batches", json={"tasks": [{"type": "rt.echo", "payload": {"text": str(i)}}
                                                              for i in range(3)]}, headers={"traceparent": CALLER})
    assert r.status_code == 202, r.get_json()
    (server,) = spans.get_finished_spans()
    kept = {conn.hget(keys.task(t["task_id"]), keys.TaskField.TRACEPARENT) for t in r.get_json()["tasks"]}
    assert kept == {f"00-{CALLER_TRACE}-{server.context.span_id:016x}-01".encode()}
