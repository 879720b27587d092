"""What operators see is true, on fakeredis with RQ's own SimpleWorker loop (workers.worker's classes): a task's
end filed in RQ's registries (FAILED with its code and message, COMPLETED for the window, both trimmed with the
task), paused queues that no worker takes a job from (and that /readyz, /metrics and the dashboard show), the
operator API that pauses them, and rq-dashboard's edges answered 404 instead of 500."""

from __future__ import annotations

import base64
import dataclasses
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rq import Queue, SimpleWorker
from rq.job import Job, JobStatus

from app.core import keys
from app.core.config import Config
from app.core.jobclaims import Claims
from app.core.jobs import FAILED_JOB_TTL, FINISHED_JOB_TTL, JobQueue
from app.core.states import QUEUES
from app.web import create_app
from workers import runner
from workers.housekeeping import Housekeeper, PassReport
from workers.worker import StoppableSimpleWorker, cancel_aware

PASSWORD = "op-secret"
OPERATOR = {"Authorization": "Basic " + base64.b64encode(f"admin:{PASSWORD}".encode()).decode()}
SAME_ORIGIN = {**OPERATOR, "Origin": "http://localhost"}
QUICK = {"seconds": 0, "steps": 1}


@pytest.fixture
def config(tmp_path: Any) -> Config:
    return Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, dashboard_password=PASSWORD,
                           heartbeat_interval=3600)


@pytest.fixture
def client(config: Config, conn: Any) -> Iterator[Any]:
    runner.use(runner.Runner(config, conn))
    yield create_app(config, conn=conn).test_client()
    runner.use(None)


def submit(client: Any, priority: str = "default", **payload: Any) -> str:
    r = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {**QUICK, **payload}, "priority": priority,
                                           "dedup_key": uuid.uuid4().hex})
    assert r.status_code == 202, r.get_json()
    return str(r.get_json()["task_id"])


def status(client: Any, task_id: str) -> dict[str, Any]:
    return dict(client.get(f"/api/v1/tasks/{task_id}").get_json())


def burst(conn: Any, worker_class: type = StoppableSimpleWorker) -> Any:
    worker = worker_class(list(QUEUES), connection=conn)
    worker.work(burst=True, logging_level="WARNING")
    return worker


# the simple worker, and RQ's own loop with the mixins every other class gets (the fork worker's horse runs the same
# _finalize_success; it needs a real Redis: tests/integration/test_operator_truth.py)
WORKER_CLASSES: dict[str, type] = {"simple": StoppableSimpleWorker, "mixed-in": cancel_aware(SimpleWorker)}


# -- a task's end in RQ ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(WORKER_CLASSES))
def test_a_failed_task_s_job_is_in_the_failed_registry_with_its_code_and_message(client, conn, kind):
    task_id = submit(client, fail_code=10001)
    burst(conn, WORKER_CLASSES[kind])
    doc = status(client, task_id)
    assert doc["status"] == "FAILED" and doc["error"]["code"] == 10001
    failed = Queue("default", connection=conn).failed_job_registry
    assert failed.get_job_ids() == [task_id]
    job = Job.fetch(task_id, connection=conn)
    assert job.get_status() == JobStatus.FAILED
    result = job.latest_result()
    assert result is not None
    shown = result.exc_string  # what rq-dashboard shows as the exception
    assert shown == f"task FAILED with code 10001: {doc['error']['message']}"
    assert "Traceback" not in shown and "payload" not in shown
    assert 0 < conn.ttl(job.key) <= FAILED_JOB_TTL


@pytest.mark.parametrize("kind", sorted(WORKER_CLASSES))
def test_a_completed_task_s_job_stays_in_the_finished_registry_for_the_window(client, conn, kind):
    task_id = submit(client)
    burst(conn, WORKER_CLASSES[kind])
    assert status(client, task_id)["status"] == "COMPLETED"
    assert Queue("default", connection=conn).finished_job_registry.get_job_ids() == [task_id]
    job = Job.fetch(task_id, connection=conn)
    assert job.get_status() == JobStatus.FINISHED and job.ended_at is not None
    assert 0 < conn.ttl(job.key) <= FINISHED_JOB_TTL
    assert job.latest_result() is None  # no result record: the task's own hash holds the result


def test_the_registries_are_trimmed_with_the_tasks(client, conn, config):
    done, failed = submit(client), submit(client, fail_code=10002)
    burst(conn)
    jobs = JobQueue(conn, config)
    queue = Queue("default", connection=conn)
    assert queue.finished_job_registry.get_job_ids() == [done] and queue.failed_job_registry.get_job_ids() == [failed]
    housekeeper = Housekeeper(conn, config)
    far = int(1000 * (max(FINISHED_JOB_TTL, FAILED_JOB_TTL, config.result_ttl) + 10))
    now = int(Job.fetch(done, connection=conn).ended_at.timestamp() * 1000)  # type: ignore[union-attr]
    housekeeper.expire(PassReport("expire"), now + far)  # both tasks' results are over: tombstones
    assert status(client, done)["status"] == "EXPIRED" and status(client, failed)["status"] == "EXPIRED"
    assert queue.finished_job_registry.get_job_ids() == [] and queue.failed_job_registry.get_job_ids() == []
    assert not conn.exists(Job.key_for(done), Job.key_for(failed))
    jobs.trim_finished()  # and trimming what is left is a no-op


def test_trim_drops_failed_entries_whose_window_is_over(conn, config):
    queue = Queue("default", connection=conn)
    conn.zadd(queue.failed_job_registry.key, {"old": 1, "recent": 2**40})  # scored by when their window ends
    JobQueue(conn, config).trim_finished()
    assert queue.failed_job_registry.get_job_ids(cleanup=False) == ["recent"]


# -- paused queues -----------------------------------------------------------------------------------


def test_a_worker_takes_nothing_from_a_paused_queue_and_serves_the_others(client, conn):
    conn.sadd(keys.PAUSED_QUEUES, "default")
    held, served = submit(client, "default"), submit(client, "low")
    burst(conn)
    assert status(client, served)["status"] == "COMPLETED"
    assert status(client, held)["status"] == "PENDING"
    assert Queue("default", connection=conn).get_job_ids() == [held]  # still first in its queue
    conn.srem(keys.PAUSED_QUEUES, "default")
    burst(conn)
    assert status(client, held)["status"] == "COMPLETED"


def test_a_worker_whose_queues_are_all_paused_takes_nothing(client, conn):
    conn.sadd(keys.PAUSED_QUEUES, *QUEUES)
    ids = [submit(client, name) for name in QUEUES]
    burst(conn)
    assert [status(client, i)["status"] for i in ids] == ["PENDING"] * 3


def test_a_pause_that_lands_while_the_worker_waits_is_honoured_by_its_next_take(client, conn):
    first, second = submit(client, "default"), submit(client, "default")
    conn.sadd(keys.PAUSED_QUEUES, "default")  # the worker is already listening: the take reads the set itself
    taken = Claims(conn).take("w1", [(name, Queue(name, connection=conn).key) for name in QUEUES])
    assert taken is None
    assert Queue("default", connection=conn).get_job_ids() == [first, second]  # untouched, in order


def test_the_operator_api_pauses_and_resumes_a_queue(client, conn):
    r = client.post("/api/v1/queues/default/pause", headers=OPERATOR)
    assert r.status_code == 200 and r.get_json() == {"queue": "default", "paused": True, "paused_queues": ["default"]}
    assert client.post("/api/v1/queues/default/pause", headers=OPERATOR).get_json()["paused"] is True  # idempotent
    assert conn.smembers(keys.PAUSED_QUEUES) == {b"default"}
    assert submit(client, "default")  # submits are still accepted
    r = client.post("/api/v1/queues/default/resume", headers=SAME_ORIGIN)
    assert r.status_code == 200 and r.get_json() == {"queue": "default", "paused": False, "paused_queues": []}


@pytest.mark.parametrize("path, headers, code, field", [
    ("/api/v1/queues/nosuch/pause", OPERATOR, 404, "queue"),
    ("/api/v1/queues/default/pause", {}, 401, None),
    ("/api/v1/queues/default/pause", {**OPERATOR, "Origin": "https://evil.example"}, 403, "Origin"),
    ("/api/v1/queues/default/pause", {**OPERATOR, "Sec-Fetch-Site": "cross-site"}, 403, "Sec-Fetch-Site"),
])
def test_the_operator_api_refuses_with_a_problem(client, conn, path, headers, code, field):
    r = client.post(path, headers=headers)
    assert r.status_code == code and r.headers["Content-Type"] == "application/problem+json"
    assert field is None or list(r.get_json()["errors"]) == [field]
    assert conn.smembers(keys.PAUSED_QUEUES) == set()


def test_without_an_operator_password_the_operator_api_is_off(config, conn):
    app = create_app(dataclasses.replace(config, dashboard_password=""), conn=conn)
    r = app.test_client().post("/api/v1/queues/default/pause", headers=OPERATOR)
    assert r.status_code == 404 and r.get_json()["detail"] == "operator API disabled"


def test_readyz_metrics_and_the_dashboard_show_a_paused_queue(client, conn):
    conn.sadd(keys.PAUSED_QUEUES, "low")
    assert client.get("/readyz").get_json()["paused_queues"] == ["low"]
    text = client.get("/metrics", headers=OPERATOR).get_data(as_text=True)
    samples = {s.labels["queue"]: s.value for family in text_string_to_metric_families(text)
               if family.name == "taskport_queue_paused" for s in family.samples}
    assert samples == {"high": 0, "default": 0, "low": 1}
    queues = {q["name"]: q for q in client.get("/rq/0/data/queues.json", headers=OPERATOR).get_json()["queues"]}
    assert queues["low (paused)"]["paused"] is True and queues["default"]["paused"] is False
    assert queues["low (paused)"]["queued_url"].endswith("/view/jobs/low/queued/8/asc/1")  # links stay the queue's


# -- rq-dashboard's edges --------------------------------------------------------------------------------

EDGES = [
    ("GET", "/rq/0/view/job/nosuch", 404, "job_id"),
    ("GET", "/rq/0/data/job/nosuch.json", 404, "job_id"),
    ("GET", "/rq/5/view/queues", 404, "instance_number"),
    ("GET", "/rq/1/data/queues.json", 404, "instance_number"),
    ("GET", "/rq/0/data/jobs/default/bogus/8/asc/1.json", 404, "registry_name"),
    ("GET", "/rq/0/data/jobs/default/queued/0/asc/1.json", 404, "per_page"),
    ("GET", "/rq/0/data/jobs/default/queued/x/asc/1.json", 404, "per_page"),
    ("GET", "/rq/0/data/jobs/default/queued/8/up/1.json", 404, "order"),
    ("GET", "/rq/0/data/jobs/default/queued/8/asc/0.json", 404, "page"),
    ("GET", "/rq/0/data/jobs/nosuch/queued/8/asc/1.json", 404, "queue_name"),
    ("POST", "/rq/queue/default/compact", 403, None),
    ("POST", "/rq/job/nosuch/requeue", 404, "job_id"),
    ("POST", "/rq/requeue/nosuch", 404, "queue_name"),
]


@pytest.mark.parametrize("method, path, code, field", EDGES)
def test_rq_dashboard_answers_its_edges_with_a_problem_never_a_500(client, method, path, code, field, caplog):
    r = client.open(path, method=method, headers=SAME_ORIGIN)
    assert r.status_code == code, r.get_data(as_text=True)
    assert r.headers["Content-Type"] == "application/problem+json"
    assert field is None or list(r.get_json()["errors"]) == [field]
    assert not [rec for rec in caplog.records if rec.exc_info], "no traceback in the log"


def test_the_job_page_gets_the_exception_escaped(client, conn):
    task_id = submit(client, fail_code=10001)
    burst(conn)
    conn.hset(Job.key_for(task_id), "description", "<img src=x onerror=alert(1)>")
    doc = client.get(f"/rq/0/data/job/{task_id}.json", headers=OPERATOR).get_json()
    assert doc["description"] == "&lt;img src=x onerror=alert(1)&gt;"  # job.html renders it as HTML
    assert doc["exc_info"].startswith("task FAILED with code 10001: ")


def test_trim_keeps_the_newest_finished_jobs_of_a_queue_only(conn, config, monkeypatch):
    monkeypatch.setattr("app.core.jobs.FINISHED_JOBS_KEPT", 2)
    registry = Queue("default", connection=conn).finished_job_registry
    for n in range(4):
        conn.hset(Job.key_for(f"j{n}"), "status", "finished")
        conn.zadd(registry.key, {f"j{n}": 2**40 + n})  # windows that end in the future, oldest first
    JobQueue(conn, config).trim_finished()
    assert registry.get_job_ids(cleanup=False) == ["j2", "j3"]
    assert [conn.exists(Job.key_for(f"j{n}")) for n in range(4)] == [0, 0, 1, 1]


def test_the_clis_default_operator_user_is_the_services():
    from taskport.cli import OPERATOR_USER

    assert OPERATOR_USER == Config.__dataclass_fields__["dashboard_user"].default
