"""Readiness on fakeredis: workers per queue, housekeeping age, /readyz, the submit warning, /metrics."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families
from rq import SimpleWorker, Worker
from rq.job import Job
from rq.utils import utcformat

from app.core import keys
from app.core.housekeeping_passes import PASSES, job_id
from app.core.states import QUEUES
from app.web import create_app
from app.web.readiness import STAT_UNSERVED, WARNING_HEADER, Readiness, WorkerWatch, housekeeping_ages, live_workers
from tests.integration.harness import wait_until
from workers.worker import StoppableSimpleWorker


def start_worker(conn, queues=QUEUES) -> SimpleWorker:
    worker = SimpleWorker(list(queues), connection=conn)
    worker.register_birth()
    return worker


def passes_ran(conn, seconds_ago: float) -> None:
    ended = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    for name in PASSES:
        conn.hset(Job.key_for(job_id(name)), "ended_at", utcformat(ended))


def test_workers_are_counted_per_queue_and_only_while_registered(conn):
    assert live_workers(conn) == dict.fromkeys(QUEUES, 0)
    both = start_worker(conn)
    start_worker(conn, ["high"])
    assert live_workers(conn) == {"high": 2, "default": 1, "low": 1}
    conn.delete(both.key)  # a killed worker's registration expired: RQ's set still names it
    assert live_workers(conn) == {"high": 1, "default": 0, "low": 0}


def test_housekeeping_age_is_read_from_the_periodic_jobs(conn):
    assert housekeeping_ages(conn) == dict.fromkeys(PASSES, None)
    passes_ran(conn, 42)
    assert all(41 <= age <= 60 for age in housekeeping_ages(conn).values())


def test_readiness_names_each_problem(conn, config):
    passes_ran(conn, 3 * config.housekeeping_interval)
    problems = Readiness.read(conn, config).problems
    assert [p for p in problems if p.startswith("no worker")] == [f"no worker listens on queue {q}" for q in QUEUES]
    assert sum("housekeeping pass" in p and "ago" in p for p in problems) == len(PASSES)
    start_worker(conn)
    passes_ran(conn, 2 * config.housekeeping_interval - 1)
    assert Readiness.read(conn, config).ready


def test_readyz_is_503_with_the_report_until_workers_and_housekeeping_run(client, conn):
    r = client.get("/readyz")
    assert r.status_code == 503 and r.headers["Retry-After"] and r.content_type.startswith("application/json")
    body = r.get_json()
    assert body["status"] == "degraded" and body["store"] == "ok" and body["workers"] == dict.fromkeys(QUEUES, 0)
    assert body["housekeeping"]["last_run_seconds_ago"] == dict.fromkeys(PASSES, None)
    start_worker(conn)
    passes_ran(conn, 1)
    r = client.get("/readyz")
    assert r.status_code == 200 and r.get_json()["status"] == "ready" and r.get_json()["problems"] == []


def submit(client, priority="default"):
    body = {"type": "demo.sleep", "payload": {}, "priority": priority, "dedup_key": uuid.uuid4().hex}
    return client.post("/api/v1/tasks", json=body)


def test_a_submit_no_worker_listens_for_is_accepted_with_a_warning_and_counted(client, conn):
    r = submit(client)
    assert r.status_code == 202 and r.headers[WARNING_HEADER] == "no-worker; queue=default"
    assert int(conn.hget(keys.STATS, STAT_UNSERVED)) == 1
    samples = {(s.name, tuple(s.labels.items())): s.value for f in text_string_to_metric_families(
        client.get("/metrics").get_data(as_text=True)) for s in f.samples}
    assert samples[("taskport_queue_workers", (("queue", "default"),))] == 0
    assert samples[("taskport_tasks_total", (("event", STAT_UNSERVED),))] == 1
    assert not any(name == "taskport_housekeeping_age_seconds" for name, _ in samples)


def test_the_no_worker_warning_names_the_task_or_the_batch(client, caplog):
    caplog.set_level(logging.WARNING, logger="app.web.service")
    task_id = submit(client).get_json()["task_id"]
    body = {"tasks": [{"type": "demo.sleep", "payload": {}, "dedup_key": uuid.uuid4().hex}]}
    batch = client.post("/api/v1/batches", json=body)
    assert batch.status_code == 202 and batch.headers[WARNING_HEADER] == "no-worker; queue=default"
    batch_id = batch.get_json()["batch_id"]
    said = [(record.task_id, record.getMessage()) for record in caplog.records]
    assert said == [(task_id, "task submitted while no worker listens on queue default"),
                    ("-", f"batch {batch_id} submitted while no worker listens on queue default")]


def test_no_warning_when_a_worker_listens_on_the_tasks_queue(config, conn):
    start_worker(conn, ["high"])
    passes_ran(conn, 5)
    client = create_app(config, conn=conn).test_client()
    assert WARNING_HEADER not in submit(client, "high").headers
    assert submit(client, "low").headers[WARNING_HEADER] == "no-worker; queue=low"
    assert submit(client, "bogus").status_code == 422  # a rejected submit gets no warning either
    ages = [s for f in text_string_to_metric_families(client.get("/metrics").get_data(as_text=True))
            for s in f.samples if s.name == "taskport_housekeeping_age_seconds"]
    assert len(ages) == len(PASSES) and all(4 <= s.value <= 30 for s in ages)


def test_the_worker_watch_rereads_at_most_once_a_second(conn, monkeypatch):
    watch = WorkerWatch(conn)
    assert watch.unserved() == list(QUEUES)
    start_worker(conn)
    assert watch.unserved() == list(QUEUES)  # cached
    monkeypatch.setattr("app.web.readiness.WORKER_CACHE_SECONDS", 0.0)
    assert watch.unserved() == []


def leased_worker(conn, lease: int) -> StoppableSimpleWorker:
    worker = StoppableSimpleWorker(list(QUEUES), connection=conn)
    worker.lease = lease
    worker.register_birth()
    return worker


def test_a_dead_workers_registration_expires_within_its_lease_busy_or_idle(conn):
    worker = leased_worker(conn, 90)
    try:
        assert 0 < conn.ttl(worker.key) <= 90  # RQ's birth asked for 480 s
        worker.heartbeat()  # idle: RQ asks for worker_ttl + 60
        assert 0 < conn.ttl(worker.key) <= 90
        worker.heartbeat(3660 + 60, pipeline=None)  # busy in-process: RQ asks for the job's timeout + 60 (an hour)
        assert 0 < conn.ttl(worker.key) <= 90
        assert live_workers(conn) == dict.fromkeys(QUEUES, 1)
        conn.delete(worker.key)  # what the lease does to a worker killed with SIGKILL, 90 s on
        assert live_workers(conn) == dict.fromkeys(QUEUES, 0)
    finally:
        worker._renewing.set()


def test_a_live_worker_renews_its_lease_and_registers_again_if_it_was_lost(conn):
    worker = leased_worker(conn, 3)  # renewed every second
    try:
        conn.expire(worker.key, 1)
        wait_until(lambda: conn.ttl(worker.key) > 1, timeout=5, message="the lease renewed")
        conn.delete(worker.key)  # Redis was away for longer than the lease
        conn.srem(f"rq:workers:{QUEUES[0]}", worker.key)
        wait_until(lambda: live_workers(conn) == dict.fromkeys(QUEUES, 1), timeout=5, message="registered again")
        assert [w.name for w in Worker.all(connection=conn)] == [worker.name]
    finally:
        worker.register_death()
    assert live_workers(conn) == dict.fromkeys(QUEUES, 0) and worker._renewing.is_set()
