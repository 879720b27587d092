"""GET /metrics: Prometheus text with the queue, task and HTTP metrics, read from Redis at scrape time."""

from __future__ import annotations

import fakeredis
from prometheus_client.parser import text_string_to_metric_families

from app.core import keys
from app.web import create_app
from app.web.runtime import EXTENSION


def scrape(client, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of one scrape, parsed by prometheus-client's own parser."""
    r = client.get("/metrics", headers=headers)
    assert r.status_code == 200
    assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.get_data(as_text=True)) for s in family.samples}


def submit(client) -> str:
    return client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]


def test_queues_and_tasks_are_gauges_read_from_redis(config, conn):
    app = create_app(config, conn=conn)
    client = app.test_client()
    first, _ = submit(client), submit_other(client)
    app.extensions[EXTENSION].service.store.start(first, "run-1")
    samples = scrape(client)
    assert samples[("taskport_redis_up", ())] == 1
    assert samples[("taskport_queue_length", (("queue", "default"),))] == 2  # start() does not pop RQ's list
    assert samples[("taskport_queue_length", (("queue", "high"),))] == 0
    assert samples[("taskport_tasks_processing", ())] == 1
    assert samples[("taskport_rq_jobs", (("queue", "low"), ("registry", "failed")))] == 0
    assert samples[("taskport_rq_workers", ())] == 0


def submit_other(client) -> str:
    return client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"steps": 2}}).get_json()["task_id"]


def test_every_stats_field_is_a_task_counter(config, conn):
    client = create_app(config, conn=conn).test_client()
    conn.hset(keys.STATS, mapping={"submitted": 5, "completed": 3, "recovered": 1, "garbage": "x"})
    samples = scrape(client)
    assert samples[("taskport_tasks_total", (("event", "submitted"),))] == 5
    assert samples[("taskport_tasks_total", (("event", "completed"),))] == 3
    assert samples[("taskport_tasks_total", (("event", "recovered"),))] == 1
    assert ("taskport_tasks_total", (("event", "garbage"),)) not in samples


def test_http_requests_are_counted_and_timed_by_endpoint_and_status(config, conn):
    client = create_app(config, conn=conn).test_client()
    task_id = submit(client)
    client.get(f"/api/v1/tasks/{task_id}")
    client.get(f"/api/v1/tasks/{task_id}")
    client.get("/api/v1/tasks/not-a-task")
    client.get("/no/such/path")
    samples = scrape(client)
    count = "taskport_http_requests_total"
    assert samples[(count, (("endpoint", "tasks.status"), ("method", "GET"), ("status", "200")))] == 2
    assert samples[(count, (("endpoint", "tasks.status"), ("method", "GET"), ("status", "404")))] == 1
    assert samples[(count, (("endpoint", "tasks.submit"), ("method", "POST"), ("status", "202")))] == 1
    assert samples[(count, (("endpoint", "unmatched"), ("method", "GET"), ("status", "404")))] == 1
    timed = "taskport_http_request_duration_seconds_count"
    assert samples[(timed, (("endpoint", "tasks.status"), ("status", "200")))] == 2


def test_each_app_has_its_own_registry(config, conn):
    first = create_app(config, conn=conn).test_client()
    second = create_app(config, conn=conn).test_client()
    first.get("/healthz")
    assert not any(name == "taskport_http_requests_total" and ("endpoint", "health.healthz") in labels
                   for name, labels in scrape(second))


def test_openmetrics_when_the_scraper_asks_for_it(config, conn):
    client = create_app(config, conn=conn).test_client()
    r = client.get("/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert r.headers["Content-Type"].startswith("application/openmetrics-text")
    assert r.get_data(as_text=True).rstrip().endswith("# EOF")


def test_an_unreachable_redis_is_reported_not_raised(config):
    server = fakeredis.FakeServer()
    server.connected = False  # every command raises redis.ConnectionError
    dead = fakeredis.FakeRedis(server=server)
    try:
        samples = scrape(create_app(config, conn=dead).test_client())
    finally:
        dead.close()
    assert samples[("taskport_redis_up", ())] == 0
    assert not any(name == "taskport_queue_length" for name, _ in samples)
