"""What operators see is true, with real processes (a web, real workers, a real redis-server): rq-dashboard shows
each task's end (FAILED with its code and message, COMPLETED in the finished registry), its Requeue runs a failed
task again, its edges answer 404 (never a 500 with a traceback in the log), and a paused queue gives no job to
any worker, through restarts, while its other queues are served; /readyz, /metrics and the dashboard show it."""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
import requests

from tests.integration.harness import Api, RedisServer, Stack, wait_until

PASSWORD = "op-secret"
OPERATOR = ("admin", PASSWORD)
QUICK = {"seconds": 0, "steps": 1}


@pytest.fixture
def stack_settings() -> dict[str, Any]:
    return {"dashboard_password": PASSWORD}


def data(stack: Stack, path: str) -> Any:
    r = requests.get(stack.url(f"/rq/0/data/{path}"), auth=OPERATOR, timeout=5)
    assert r.status_code == 200, r.text
    return r.json()


def metric(stack: Stack, name: str, **labels: str) -> float | None:
    text = requests.get(stack.url("/metrics"), auth=OPERATOR, timeout=5).text
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    found = re.search(rf"^{name}{{{re.escape(wanted)}}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else None


def create(api: Api, priority: str = "default", **payload: Any) -> str:
    return api.create("demo.sleep", {**QUICK, **payload}, priority=priority, dedup_key=uuid.uuid4().hex)


@pytest.mark.parametrize("worker_class", ["simple", "fork"])
def test_rq_dashboard_shows_each_end_and_its_requeue_runs_a_failed_task_again(stack: Stack, api: Api,
                                                                             worker_class: str) -> None:
    stack.configure(worker_class=worker_class)
    stack.start_worker()
    failed, done = create(api, fail_code=10001), create(api)
    error = api.wait_for(failed, "FAILED")["error"]
    api.wait_for(done, "COMPLETED")

    [job] = wait_until(lambda: data(stack, "jobs/default/failed/8/asc/1.json")["jobs"], message="the failed job")
    assert job["id"] == failed and job["exc_info"] == f"task FAILED with code 10001: {error['message']}"
    info = data(stack, f"job/{failed}.json")
    assert info["status"] == "failed" and "Traceback" not in info["exc_info"] and '"seconds"' not in str(info)
    finished = wait_until(lambda: data(stack, "jobs/default/finished/8/asc/1.json")["jobs"], message="the finished job")
    assert [j["id"] for j in finished] == [done] and data(stack, f"job/{done}.json")["status"] == "finished"
    counts = {q["name"]: q for q in data(stack, "queues.json")["queues"]}["default"]
    assert (counts["failed_job_registry_count"], counts["finished_job_registry_count"]) == (1, 1), counts
    assert metric(stack, "taskport_rq_jobs", queue="default", registry="failed") == 1
    assert metric(stack, "taskport_rq_jobs", queue="default", registry="finished") == 1

    requeued = requests.post(stack.url(f"/rq/job/{failed}/requeue"), auth=OPERATOR, timeout=5,
                             headers={"Origin": stack.base_url})
    assert requeued.status_code == 200 and requeued.json()["task_id"] == failed, requeued.text
    again = wait_until(lambda: (d := api.status(failed))["status"] == "FAILED" and d["attempts"] == 2 and d,
                       message="the task to run again and fail again")
    assert again["error"] == error
    ids = wait_until(lambda: [j["id"] for j in data(stack, "jobs/default/failed/8/asc/1.json")["jobs"]
                              if j["id"] != failed], message="the second run's job in the failed registry")
    assert [i.split("_")[0] for i in ids] == [failed]  # its own job id (app.core.jobs.rerun_job_id): the old one left
    assert failed not in [j["id"] for j in data(stack, "jobs/default/failed/8/asc/1.json")["jobs"]]


EDGES = [("GET", "/rq/0/view/job/nosuch", 404), ("GET", "/rq/0/data/job/nosuch.json", 404),
         ("GET", "/rq/5/view/queues", 404), ("GET", "/rq/0/data/jobs/default/bogus/8/asc/1.json", 404),
         ("POST", "/rq/queue/default/compact", 403), ("POST", "/rq/job/nosuch/requeue", 404)]


def test_rq_dashboard_answers_its_edges_with_a_problem_and_logs_no_traceback(stack: Stack, api: Api) -> None:
    for method, path, code in EDGES:
        r = requests.request(method, stack.url(path), auth=OPERATOR, headers={"Origin": stack.base_url}, timeout=5)
        assert (r.status_code, r.headers["Content-Type"]) == (code, "application/problem+json"), (path, r.text)
        assert "Traceback" not in r.text
    log = stack.procs[0].log()
    assert "Traceback" not in log and " ERROR " not in log, log


def pause(stack: Stack, queue: str, action: str = "pause") -> dict[str, Any]:
    r = requests.post(stack.url(f"/api/v1/queues/{queue}/{action}"), auth=OPERATOR, timeout=5)
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


def test_a_paused_queue_gives_no_job_to_any_worker_through_restarts(stack: Stack, api: Api,
                                                                    redis_server: RedisServer) -> None:
    [worker] = stack.start_worker()
    running = create(api, seconds=2, steps=20)
    api.wait_for(running, "PROCESSING")
    assert pause(stack, "default") == {"queue": "default", "paused": True, "paused_queues": ["default"]}
    api.wait_for(running, "COMPLETED", timeout=15)  # a running task finishes
    held = create(api)  # accepted (202) while paused
    served = create(api, "low")  # the worker, idle on all three queues when the pause came, serves the others
    api.wait_for(served, "COMPLETED")
    assert api.status(held)["status"] == "PENDING"

    ready = requests.get(stack.url("/readyz"), timeout=5).json()  # degraded here only for want of a scheduler
    assert ready["paused_queues"] == ["default"] and not [p for p in ready["problems"] if "queue" in p], ready
    assert metric(stack, "taskport_queue_paused", queue="default") == 1
    assert metric(stack, "taskport_queue_paused", queue="low") == 0
    assert "default (paused)" in [q["name"] for q in data(stack, "queues.json")["queues"]]

    stack.stop(worker)  # the pause lives in Redis: a new worker, and Redis restarted, keep it
    redis_server.restart()
    stack.start_worker()
    api.wait_for(create(api, "high"), "COMPLETED", timeout=15)
    assert api.status(held)["status"] == "PENDING"

    assert pause(stack, "default", "resume")["paused_queues"] == []
    api.wait_for(held, "COMPLETED", timeout=15)
    log = "\n".join(p.log() for p in stack.procs)
    assert "Traceback" not in log, log


# minutes of real processes and timeouts: `make test-slow` (CI runs it), which keeps `make test` within its budget
pytestmark = pytest.mark.slow
