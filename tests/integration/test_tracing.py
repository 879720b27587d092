"""One trace from a submit to its run and its callback, across real processes (issue 33, point 2): a web, a worker,
a scheduler and a deliverer, configured only by OTEL_* variables to export over OTLP/HTTP to a collector this
test serves on loopback (the spans decoded with opentelemetry-proto, kept in memory), and a callback receiver.
The in-process view of the same spans, on the SDK's in-memory exporter: tests/unit/test_tracing.py.
"""

from __future__ import annotations

import http.server
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.integration.harness import Api, RedisServer, Stack, wait_until
from tests.integration.test_callbacks import start_with_deliverer
from tests.unit.test_callbacks import SECRET, Receiver

CALLER_TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER = f"00-{CALLER_TRACE}-b7ad6b7169203331-01"  # the W3C example: the submitting caller's span


def collected(handler: http.server.BaseHTTPRequestHandler) -> None:
    """The collector's answer to an export: OTLP/HTTP's 200 with an empty protobuf response."""
    body = ExportTraceServiceResponse().SerializeToString()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/x-protobuf")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def spans(collector: Receiver) -> list[dict[str, Any]]:
    """Every span the collector got: name, kind, ids (hex), parent, attributes and the process's taskport.role."""
    found = []
    for _, body, path in list(collector.got):
        assert path == "/v1/traces", path
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
            for scope in rs.scope_spans:
                for s in scope.spans:
                    attrs = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in s.attributes}
                    found.append({"name": s.name, "kind": s.kind, "trace": s.trace_id.hex(), "span": s.span_id.hex(),
                                  "parent": s.parent_span_id.hex(), "attributes": attrs,
                                  "role": resource.get("taskport.role"), "service": resource.get("service.name")})
    return found


class TracedStack(Stack):
    """A stack whose processes export their spans to ``collector`` (OTEL_* only, as an operator sets them)."""

    def __init__(self, collector: Receiver, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.otel = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                     "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{collector.port}",
                     "OTEL_SERVICE_NAME": "taskport-test", "OTEL_BSP_SCHEDULE_DELAY": "100"}

    def environ(self, role: str = "web") -> dict[str, str]:
        return {**super().environ(role), **self.otel}


@pytest.fixture(scope="module")
def collector() -> Iterator[Receiver]:
    c = Receiver(answer=collected)
    yield c
    c.close()


# each kind of worker: a fork or spawn work horse ends with os._exit, so its run span is flushed as the run ends
@pytest.fixture(scope="module", params=["simple", "fork", "spawn"])
def stack(request: pytest.FixtureRequest, collector: Receiver,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("tracing")
    server = RedisServer(workdir / "redis").start()
    s = TracedStack(collector, server.url, workdir / "stack", callback_secrets=f"public:{SECRET}",
                    callback_allow_hosts="127.0.0.1", worker_class=request.param, retry_backoff="0",
                    processors="tests.userprocs.tasks,tests.userprocs.traced")
    try:
        start_with_deliverer(s)
        yield s
    finally:
        s.teardown()
        server.close()


def test_the_submit_its_run_and_its_callback_are_spans_of_one_trace(stack: Stack, collector: Receiver) -> None:
    hook = Receiver((200,))
    try:
        with Api(stack.base_url) as api:
            task_id = api.create("demo.sleep", {"steps": 1, "seconds": 0.1}, headers={"traceparent": CALLER},
                                 callback={"url": hook.url("/hooks/task")})
            wait_until(lambda: api.status(task_id)["callback"]["state"] == "delivered", timeout=20, interval=0.1,
                       message=lambda: f"the delivery\n{stack.log_tails()}")

        def all_three() -> dict[str, dict[str, Any]] | None:
            mine = {s["role"]: s for s in spans(collector) if s["attributes"].get("taskport.task_id") == task_id
                    or f":{task_id}:" in s["attributes"].get("taskport.delivery_id", "")}
            return mine if {"web", "worker", "deliverer"} <= set(mine) else None

        found = wait_until(all_three, timeout=10, interval=0.1,
                           message=lambda: f"the three spans; collected {spans(collector)}\n{stack.log_tails()}")
        web, run, callback = found["web"], found["worker"], found["deliverer"]
        assert {web["trace"], run["trace"], callback["trace"]} == {CALLER_TRACE}  # one trace, the caller's
        assert web["name"] == "POST /api/v1/tasks" and web["parent"] == "b7ad6b7169203331"
        assert run["name"] == "run demo.sleep" and run["parent"] == web["span"]
        assert run["attributes"]["taskport.attempt"] == 1 and run["attributes"]["taskport.outcome"] == "completed"
        assert callback["name"] == "callback" and callback["parent"] == web["span"]
        assert callback["attributes"]["taskport.outcome"] == "delivered"
        assert {web["service"], run["service"], callback["service"]} == {"taskport-test"}
        (headers, _, _), = hook.got  # the receiver's request carries the delivery span's context
        assert headers["traceparent"] == f"00-{CALLER_TRACE}-{callback['span']}-01"
    finally:
        hook.close()


def run_spans(collector: Receiver, task_id: str, count: int) -> list[dict[str, Any]]:
    """The task's ``count`` run spans, in attempt order, once all have arrived."""
    def arrived() -> list[dict[str, Any]] | None:
        runs = [s for s in spans(collector)
                if s["role"] == "worker" and s["attributes"].get("taskport.task_id") == task_id]
        return sorted(runs, key=lambda s: s["attributes"]["taskport.attempt"]) if len(runs) >= count else None

    return wait_until(arrived, timeout=10, interval=0.1, message=lambda: f"{count} run spans of {task_id}")


def test_a_retry_is_a_second_run_span_under_the_same_submit(stack: Stack, collector: Receiver, tmp_path) -> None:
    with Api(stack.base_url) as api:
        task_id = api.create("test.flaky", {"marker": str(tmp_path / "calls"), "fail_times": 1})
        api.wait_for(task_id, "COMPLETED")
    first, second = run_spans(collector, task_id, 2)
    assert first["parent"] == second["parent"] != "" and first["trace"] == second["trace"]
    assert [first["attributes"]["taskport.attempt"], second["attributes"]["taskport.attempt"]] == [1, 2]
    assert [first["attributes"]["taskport.outcome"], second["attributes"]["taskport.outcome"]] == [
        "not ended", "completed"]


def test_a_processor_s_own_span_is_a_child_of_its_run(stack: Stack, collector: Receiver) -> None:
    with Api(stack.base_url) as api:
        task_id = api.create("test.traced")
        api.wait_for(task_id, "COMPLETED")
    (run,) = run_spans(collector, task_id, 1)
    inner = wait_until(lambda: next((s for s in spans(collector) if s["name"] == "inner work"
                                     and s["parent"] == run["span"]), None),
                       timeout=10, interval=0.1, message=lambda: f"the processor's span under {run}")
    assert inner["trace"] == run["trace"]
