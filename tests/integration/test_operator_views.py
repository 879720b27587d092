"""What operators see, with real processes: cancels as cancels (rq-dashboard's own JSON, ``rq info``,
/metrics), every queue listed from the start, a readiness report that tells whether workers and the
scheduler run, a scheduler that stays quiet at INFO while there is nothing to do, and an operator
surface that a cross-site page cannot drive (dashboard actions POST and same-origin only, /metrics
behind the operator's credentials)."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import rq

from app.core import keys
from app.core.states import QUEUES
from app.web.readiness import STAT_UNSERVED, WARNING_HEADER
from tests.integration.harness import TASKS, Api, Stack, wait_until

PASSWORD = "op-secret"
OPERATOR = ("admin", PASSWORD)
INTERVAL = 2  # seconds between housekeeping passes in these tests


@pytest.fixture
def stack_settings() -> dict[str, Any]:
    return {"dashboard_password": PASSWORD, "housekeeping_interval": INTERVAL, "scheduler_interval": 0.5}


def dashboard(stack: Stack, path: str) -> dict:
    response = requests.get(stack.url(f"/rq/0/data/{path}"), auth=OPERATOR, timeout=5)
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


def rq_info(stack: Stack) -> str:
    """``rq info`` (RQ's own command line) against the stack's Redis."""
    rq = Path(sys.executable).with_name("rq")
    out = subprocess.run([str(rq), "info", "--url", stack.config.redis_url, "--only-queues"],
                         capture_output=True, text=True, timeout=30, check=True)
    return out.stdout


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one Prometheus sample (None when absent)."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    match = re.search(rf"^{name}{{{re.escape(wanted)}}} (\S+)$" if labels else rf"^{name} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def test_a_cancelled_running_task_is_a_cancel_in_rq_dashboard_rq_info_and_metrics(stack: Stack, api: Api) -> None:
    queues = {q["name"]: q for q in dashboard(stack, "queues.json")["queues"]}
    assert set(QUEUES) <= set(queues), f"every queue is listed before any job: {sorted(queues)}"
    assert all(name in rq_info(stack) for name in QUEUES)

    stack.start_worker()  # fork: the cancel kills the work horse (RQ's "stopped" path)
    running = api.create("demo.sleep", {"seconds": 30, "steps": 300})
    wait_until(lambda: api.status(running)["status"] == "PROCESSING", message="the sleep to run")
    assert api.delete(f"{TASKS}/{running}").status_code == 204
    cancelled = wait_until(lambda: dashboard(stack, "jobs/default/canceled/8/asc/1.json")["jobs"],
                           message="the stopped job in rq-dashboard's canceled list")

    [job] = cancelled
    assert job["id"] == running and job["ended_at"], job
    ended = datetime.fromisoformat(job["ended_at"])
    assert abs((datetime.now(UTC) - ended).total_seconds()) < 30, job  # "canceled N seconds ago" is right
    assert dashboard(stack, f"job/{running}.json")["status"] == "canceled"
    assert dashboard(stack, "jobs/default/failed/8/asc/1.json")["jobs"] == []
    counts = {q["name"]: q for q in dashboard(stack, "queues.json")["queues"]}["default"]
    assert (counts["failed_job_registry_count"], counts["canceled_job_registry_count"]) == (0, 1), counts
    info = rq_info(stack)
    assert re.search(r"^default\s+\|\s*0, 0 executing, \d+ finished, 0 failed$", info, re.M), info
    text = requests.get(stack.url("/metrics"), auth=OPERATOR, timeout=5).text
    assert metric(text, "taskport_rq_jobs", queue="default", registry="canceled") == 1
    assert metric(text, "taskport_rq_jobs", queue="default", registry="failed") == 0
    assert metric(text, "taskport_tasks_total", event="cancelled") == 1
    assert metric(text, "taskport_tasks_total", event="failed") is None


def test_readiness_reports_workers_and_housekeeping_and_a_submit_without_worker_is_flagged(
    stack: Stack, api: Api
) -> None:
    def ready() -> requests.Response:
        return requests.get(stack.url("/readyz"), timeout=5)

    first = ready()
    assert first.status_code == 503 and first.json()["status"] == "degraded"
    assert first.json()["workers"] == dict.fromkeys(QUEUES, 0)

    workers = stack.start_worker(2)
    scheduler = stack.start_scheduler()
    body = wait_until(lambda: (r := ready()).status_code == 200 and r.json(), timeout=15,
                      message=lambda: f"/readyz to be ready: {ready().json()}")
    assert body["status"] == "ready" and body["workers"] == dict.fromkeys(QUEUES, 2) and body["problems"] == []
    assert all(age is not None and age <= 2 * INTERVAL for age in body["housekeeping"]["last_run_seconds_ago"].values())
    served = api.submit("demo.sleep", {})
    assert served.status_code == 202 and WARNING_HEADER not in served.headers

    stack.stop(workers)  # a warm shutdown unregisters them
    degraded = wait_until(lambda: (r := ready()).status_code == 503 and r.json(), message="/readyz to see no worker")
    assert degraded["workers"] == dict.fromkeys(QUEUES, 0)
    assert "no worker listens on queue default" in degraded["problems"]
    unserved = wait_until(lambda: (r := api.submit("demo.sleep", {}, dedup_key=uuid.uuid4().hex)).headers.get(
        WARNING_HEADER) and r, message="a submit to carry the warning (the web re-reads workers each second)")
    assert unserved.status_code == 202 and unserved.headers[WARNING_HEADER] == "no-worker; queue=default"
    text = requests.get(stack.url("/metrics"), auth=OPERATOR, timeout=5).text
    assert metric(text, "taskport_queue_workers", queue="default") == 0
    assert (metric(text, "taskport_tasks_total", event=STAT_UNSERVED) or 0) >= 1

    stack.stop(scheduler)
    stale = wait_until(lambda: any("housekeeping pass" in p for p in ready().json()["problems"]),
                       timeout=4 * INTERVAL + 5, message="/readyz to see housekeeping stop")
    assert stale


def test_an_idle_scheduler_is_quiet_at_info_and_a_pass_that_acts_logs_one_line(stack: Stack) -> None:
    stack.configure(housekeeping_interval=INTERVAL, scheduler_interval=0.5, task_ttl=2)
    stack.start_web()
    scheduler = stack.start_scheduler()
    conn = stack.redis()

    def passes() -> int:
        return int(conn.hget(keys.STATS, "housekeeping_expire") or 0)

    try:
        wait_until(lambda: passes() >= 2, timeout=4 * INTERVAL + 10, message="two expire passes")
        with Api(stack.base_url) as api:
            task_id = api.create("demo.sleep", {})  # no worker: it stays PENDING, then expires (-4)
            api.wait_for(task_id, "EXPIRED")  # the task TTL (2 s) and an expire pass: the default only bounds a failure
        seen = passes()
        wait_until(lambda: passes() >= seen + 3, timeout=5 * INTERVAL + 10, message="three more expire passes")
    finally:
        conn.close()
    log = scheduler.log()
    info = [line for line in log.splitlines() if " INFO " in line]
    assert not [line for line in info if "result will never expire" in line or "Job OK" in line], info
    assert "housekeeping: housekeeping:" not in log
    acted = [line for line in info if " pass: " in line]
    assert len(acted) == 1 and "expire pass: " in acted[0] and "expired_pending=1" in acted[0], info


def test_a_worker_at_info_tells_a_task_in_taskports_lines_only(stack: Stack, api: Api) -> None:
    """RQ's per-job INFO lines (dequeued, "Job OK") repeated taskport's own started and completed lines, at a
    tenth of a no-op delivery's CPU: a worker at INFO logs a task in taskport's lines, each with its id."""
    [worker] = stack.start_worker()
    task_id = api.create("demo.sleep", {"steps": 1}, dedup_key=uuid.uuid4().hex)
    api.wait_for(task_id, "COMPLETED")
    wait_until(lambda: f"task_id={task_id} completed" in worker.log(), message="the task's completed line")
    log = worker.log()
    lines = [line for line in log.splitlines() if task_id in line]
    assert len(lines) == 2 and all(" workers.runner " in line for line in lines), lines
    assert "Job OK" not in log


def test_dashboard_actions_refuse_get_and_other_sites_and_metrics_need_the_operator(stack: Stack, api: Api) -> None:
    conn = stack.redis()
    queue = rq.Queue("default", connection=conn)
    job = queue.enqueue("builtins.int", "not a number")
    rq.SimpleWorker([queue], connection=conn).work(burst=True)  # RQ's own worker fails it, in this process
    assert queue.failed_job_registry.get_job_ids() == [job.id]
    origin = stack.base_url
    requeue_all = stack.url("/rq/requeue/default")

    image_tag = requests.get(requeue_all, auth=OPERATOR, headers={"Referer": "https://evil.example/"}, timeout=5)
    assert image_tag.status_code == 405 and image_tag.headers["Content-Type"] == "application/problem+json"
    assert "POST" in image_tag.headers["Allow"]
    cross_site = requests.post(requeue_all, auth=OPERATOR, headers={"Origin": "https://evil.example"}, timeout=5)
    assert cross_site.status_code == 403 and list(cross_site.json()["errors"]) == ["Origin"]
    assert requests.post(requeue_all, auth=OPERATOR, timeout=5).status_code == 403  # no Origin, no Referer
    assert queue.failed_job_registry.get_job_ids() == [job.id] and queue.count == 0  # nothing moved

    same_origin = requests.post(requeue_all, auth=OPERATOR, headers={"Origin": origin}, timeout=5)
    assert same_origin.status_code == 200 and same_origin.json() == {"status": "OK", "count": 1}
    assert queue.get_job_ids() == [job.id] and queue.failed_job_registry.get_job_ids() == []

    anonymous = requests.get(stack.url("/metrics"), timeout=5)
    assert anonymous.status_code == 401 and anonymous.headers["WWW-Authenticate"].startswith("Basic ")
    assert "taskport_" not in anonymous.text
    assert requests.get(stack.url("/metrics"), auth=("admin", "wrong"), timeout=5).status_code == 401
    assert "taskport_redis_up 1.0" in requests.get(stack.url("/metrics"), auth=OPERATOR, timeout=5).text
