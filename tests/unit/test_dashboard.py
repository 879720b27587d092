"""/rq: rq-dashboard behind the operator's HTTP Basic credentials, on the app's own Redis connection; its
state-changing routes POST-only and same-origin only; /metrics for operators unless in open mode."""

from __future__ import annotations

import base64
import dataclasses

import pytest
from rq import Queue, SimpleWorker

from app.web import create_app
from app.web.dashboard import BLUEPRINT, is_dashboard_path, mutating_endpoints

PROBLEM = "application/problem+json"


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.fixture
def client(config, conn):
    return create_app(dataclasses.replace(config, dashboard_user="ops", dashboard_password="s3cret"),
                      conn=conn).test_client()


@pytest.mark.parametrize("path", ["/rq", "/rq/", "/rq/0/data/queues.json"])
def test_without_a_password_the_dashboard_is_disabled(config, conn, path):
    r = create_app(config, conn=conn).test_client().get(path, headers=basic("admin", ""))
    assert r.status_code == 404
    assert r.headers["Content-Type"] == PROBLEM
    assert r.get_json()["detail"] == "dashboard disabled"


@pytest.mark.parametrize("headers", [{}, basic("ops", "wrong"), basic("other", "s3cret"), basic("ops", ""),
                                     {"Authorization": "Bearer s3cret"}])
@pytest.mark.parametrize("path", ["/rq", "/rq/", "/rq/0/data/queues.json", "/rq/no/such/page"])
def test_missing_or_wrong_credentials_get_401_with_a_basic_challenge(client, headers, path):
    r = client.get(path, headers=headers)
    assert r.status_code == 401
    assert r.headers["WWW-Authenticate"].startswith("Basic ")
    assert r.headers["Content-Type"] == PROBLEM


def test_the_operator_sees_the_dashboard(client):
    r = client.get("/rq/", headers=basic("ops", "s3cret"))
    assert r.status_code == 200
    assert "RQ dashboard" in r.get_data(as_text=True)


def test_the_dashboard_reads_the_apps_redis(client):
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]
    queues = client.get("/rq/0/data/queues.json", headers=basic("ops", "s3cret")).get_json()["queues"]
    assert {"name": "default", "count": 1} in [{"name": q["name"], "count": q["count"]} for q in queues]
    jobs = client.get("/rq/0/data/jobs/default/queued/8/asc/1.json", headers=basic("ops", "s3cret")).get_json()
    assert [job["id"] for job in jobs["jobs"]] == [task_id]


def test_the_icon_the_dashboard_links_is_served(client):
    """rq-dashboard's pages link /static/favicon.ico (its base template): the app's own icon answers there."""
    page = client.get("/rq/", headers=basic("ops", "s3cret")).get_data(as_text=True)
    assert 'href="/static/favicon.ico"' in page
    with client.get("/static/favicon.ico") as r, client.get("/static/favicon.svg") as svg:
        assert (r.status_code, r.mimetype) == (200, "image/svg+xml")
        assert r.get_data() == svg.get_data()


OPERATOR = basic("ops", "s3cret")
SAME_ORIGIN = {**OPERATOR, "Origin": "http://localhost"}  # the test client's host


def test_deleting_jobs_is_disabled(client, conn):
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]
    r = client.post(f"/rq/job/{task_id}/delete", headers=SAME_ORIGIN)
    assert r.get_json() == {"status": "DISABLED"}
    r = client.post("/rq/queue/default/queued/empty", headers=SAME_ORIGIN)
    assert r.get_json() == {"status": "DISABLED"}
    assert conn.llen("rq:queue:default") == 1


def test_the_rest_of_the_app_needs_no_operator_credentials(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/api/v1/tasks").status_code == 200
    assert client.get("/rqx").status_code == 404  # not the dashboard's: no challenge
    assert client.get("/rq-not-the-dashboard").headers.get("WWW-Authenticate") is None


def test_the_guard_knows_the_dashboard_by_its_path_alone(config, conn):
    """The guard reads the path only: every rule of the dashboard's blueprint (its static files too) is under /rq."""
    app = create_app(config, conn=conn)
    rules = [rule.rule for rule in app.url_map.iter_rules() if rule.endpoint.startswith(f"{BLUEPRINT}.")]
    assert len(rules) > 10 and all(is_dashboard_path(rule) for rule in rules)
    assert [is_dashboard_path(p) for p in ("/rq", "/rq/", "/rq/x", "/rqx", "/r", "/", "/api/v1/rq")] == [
        True, True, True, False, False, False, False]


# -- state changes: POST only, same origin only ------------------------------------------------------

# rq-dashboard 0.9's routes that change state (rq_dashboard/web.py); requeue_all also answers GET there.
MUTATING = {
    "delete_job_view": "/rq/job/{job}/delete",
    "requeue_job_view": "/rq/job/{job}/requeue",
    "requeue_all": "/rq/requeue/default",
    "empty_queue": "/rq/queue/default/failed/empty",
    "compact_queue": "/rq/queue/default/compact",
}


@pytest.fixture
def failed_job(conn) -> str:
    """A job in the default queue's failed registry (RQ's own worker failed it)."""
    queue = Queue("default", connection=conn)
    job = queue.enqueue("builtins.int", "not a number")
    SimpleWorker([queue], connection=conn).work(burst=True)
    assert queue.failed_job_registry.get_job_ids() == [job.id]
    return job.id


def test_every_route_that_changes_state_is_known(config, conn):
    app = create_app(dataclasses.replace(config, dashboard_password="pw"), conn=conn)
    assert mutating_endpoints(app) == {f"rq_dashboard.{name}" for name in MUTATING}


@pytest.mark.parametrize("method", ["GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"])
@pytest.mark.parametrize("name", sorted(MUTATING))
def test_a_state_change_by_anything_but_post_is_a_405(client, conn, failed_job, name, method):
    r = client.open(MUTATING[name].format(job=failed_job), method=method, headers=SAME_ORIGIN)
    assert r.status_code == 405
    assert "POST" in r.headers["Allow"] and method not in r.headers["Allow"]  # Flask's router adds OPTIONS
    if method != "HEAD":
        assert r.headers["Content-Type"] == PROBLEM
        assert r.get_json()["status"] == 405
    queue = Queue("default", connection=conn)
    assert (queue.failed_job_registry.get_job_ids(), queue.count) == ([failed_job], 0)  # nothing requeued


def test_the_image_tag_attack_requeues_nothing(client, conn, failed_job):
    """<img src="http://host/rq/requeue/default"> in any page the operator opens: the browser adds Basic auth."""
    r = client.get("/rq/requeue/default", headers={**OPERATOR, "Sec-Fetch-Site": "cross-site",
                                                   "Referer": "https://evil.example/"})
    assert r.status_code == 405
    assert Queue("default", connection=conn).count == 0


def test_credentials_come_first(client):
    r = client.get("/rq/requeue/default")
    assert r.status_code == 401


@pytest.mark.parametrize("headers, field", [
    ({}, "Origin"),
    ({"Origin": "https://evil.example"}, "Origin"),
    ({"Origin": "null"}, "Origin"),
    ({"Origin": "http://localhost.evil.example"}, "Origin"),
    ({"Referer": "https://evil.example/rq/"}, "Origin"),
    ({"Origin": "http://localhost", "Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site"),
    ({"Origin": "http://localhost", "Sec-Fetch-Site": "same-site"}, "Sec-Fetch-Site"),
])
def test_a_post_from_another_site_is_a_403_naming_the_header(client, conn, failed_job, headers, field):
    r = client.post("/rq/requeue/default", headers={**OPERATOR, **headers})
    assert r.status_code == 403
    assert r.headers["Content-Type"] == PROBLEM
    assert list(r.get_json()["errors"]) == [field]
    assert Queue("default", connection=conn).count == 0


@pytest.mark.parametrize("headers", [
    {"Origin": "http://localhost"},
    {"Origin": "http://localhost", "Sec-Fetch-Site": "same-origin"},
    {"Referer": "http://localhost/rq/0/view/jobs/default/failed/8/asc/1"},  # a browser that sends no Origin
])
def test_a_same_origin_post_requeues(client, conn, failed_job, headers):
    r = client.post("/rq/requeue/default", headers={**OPERATOR, **headers})
    assert r.status_code == 200
    assert r.get_json() == {"status": "OK", "count": 1}
    assert Queue("default", connection=conn).get_job_ids() == [failed_job]


def test_one_job_is_requeued_by_a_same_origin_post(client, conn, failed_job):
    assert client.post(f"/rq/job/{failed_job}/requeue", headers=SAME_ORIGIN).get_json() == {"status": "OK"}
    assert Queue("default", connection=conn).get_job_ids() == [failed_job]


def test_the_dashboard_pages_still_render_their_post_buttons(client, failed_job):
    page = client.get("/rq/0/view/jobs/default/failed/8/asc/1", headers=OPERATOR).get_data(as_text=True)
    assert 'href="/rq/requeue/default"' in page and 'id="requeue-all-btn"' in page


# -- /metrics ------------------------------------------------------------------------------------------


def test_open_mode_metrics_answer_anyone(config, conn):
    assert create_app(config, conn=conn).test_client().get("/metrics").status_code == 200


@pytest.mark.parametrize("keys", ["", "k1:alice"])
def test_with_an_operator_password_metrics_need_the_operator(config, conn, keys):
    app = create_app(dataclasses.replace(config, api_keys=keys, dashboard_password="s3cret", dashboard_user="ops",
                                         allow_open=True), conn=conn)
    client = app.test_client()
    for headers in ({}, basic("ops", "wrong"), {"Authorization": "Bearer k1"}):
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Basic ")
        assert r.headers["Content-Type"] == PROBLEM
    r = client.get("/metrics", headers=OPERATOR)
    assert r.status_code == 200 and "taskport_" in r.get_data(as_text=True)


def test_with_api_keys_and_no_operator_password_metrics_are_off(config, conn):
    client = create_app(dataclasses.replace(config, api_keys="k1:alice", allow_open=True), conn=conn).test_client()
    r = client.get("/metrics", headers={"Authorization": "Bearer k1"})
    assert r.status_code == 404 and r.get_json()["detail"] == "metrics disabled"


def test_many_apps_in_one_process_each_mount_the_dashboard(config, conn):
    settings = dataclasses.replace(config, dashboard_password="pw")
    clients = [create_app(settings, conn=conn).test_client() for _ in range(3)]
    assert [c.get("/rq/", headers=basic("admin", "pw")).status_code for c in clients] == [200, 200, 200]
