"""The per-request middleware's shortcuts (issue 11): the WSGI-level request metrics, the open-mode Host
check's memory of headers it let through, and ensure_sync answered once per function."""

from __future__ import annotations

from typing import Any

import flask.app
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.web import create_app
from app.web.auth import PASSED_HOSTS_KEPT
from app.web.metrics import LATENCY_BUCKETS, HttpMetrics
from app.web.webapp import TaskportFlask


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_latency_lands_in_prometheus_buckets_le_inclusive() -> None:
    http = HttpMetrics()
    registry = CollectorRegistry()
    registry.register(http)
    for seconds in (0.001, 0.003, 0.003, 20.0):  # on a bound, inside one, above the last
        http.observe("tasks.status", "GET", "200", seconds)
    got = samples(registry)
    label = (("endpoint", "tasks.status"), ("status", "200"))

    def bucket(le: str) -> float:
        return got[("taskport_http_request_duration_seconds_bucket", tuple(sorted((*label, ("le", le)))))]

    assert bucket("0.001") == 1 and bucket("0.0025") == 1 and bucket("0.005") == 3
    assert bucket(str(LATENCY_BUCKETS[-1])) == 3 and bucket("+Inf") == 4
    assert got[("taskport_http_request_duration_seconds_count", label)] == 4
    assert got[("taskport_http_request_duration_seconds_sum", label)] == pytest.approx(20.007)
    assert got[("taskport_http_requests_total", (("endpoint", "tasks.status"), ("method", "GET"),
                                                   ("status", "200")))] == 4


def test_a_request_answered_by_a_before_request_hook_is_timed_too(config, conn) -> None:
    client = create_app(config, conn=conn).test_client()
    assert client.get("/healthz", headers={"Host": "evil.example"}).status_code == 400  # the Host check answers
    text = client.get("/metrics").get_data(as_text=True)
    assert 'taskport_http_request_duration_seconds_count{endpoint="health.healthz",status="400"} 1.0' in text


def test_allowed_hosts_are_remembered_but_never_a_refused_one(config, conn) -> None:
    client = create_app(config, conn=conn).test_client()
    for port in range(1, PASSED_HOSTS_KEPT + 10):  # more allowed variants than are kept: all still pass
        assert client.get("/healthz", headers={"Host": f"localhost:{port}"}).status_code == 200
    for _ in range(2):
        refused = client.get("/healthz", headers={"Host": "evil.example:8000"})
        assert refused.status_code == 400 and "Host" in refused.get_json()["errors"]
    assert client.get("/healthz", headers={"Host": "localhost:3"}).status_code == 200


def test_ensure_sync_asks_once_per_function(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[Any] = []
    real = flask.app.iscoroutinefunction

    def counting(func: Any) -> bool:
        asked.append(func)
        return real(func)

    monkeypatch.setattr(flask.app, "iscoroutinefunction", counting)
    app = TaskportFlask(__name__)

    def view() -> str:
        return "ok"

    assert app.ensure_sync(view) is view and app.ensure_sync(view) is view
    assert asked == [view]
