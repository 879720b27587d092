"""/rq: rq-dashboard behind the operator's HTTP Basic credentials, on the app's own Redis connection."""

from __future__ import annotations

import base64
import dataclasses

import pytest

from app import create_app

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


def test_deleting_jobs_is_disabled(client, conn):
    task_id = client.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {}}).get_json()["task_id"]
    r = client.post(f"/rq/job/{task_id}/delete", headers=basic("ops", "s3cret"))
    assert r.get_json() == {"status": "DISABLED"}
    r = client.post("/rq/queue/default/queued/empty", headers=basic("ops", "s3cret"))
    assert r.get_json() == {"status": "DISABLED"}
    assert conn.llen("rq:queue:default") == 1


def test_the_rest_of_the_app_needs_no_operator_credentials(client):
    assert client.get("/healthz").status_code == 200
    assert client.get("/metrics").status_code == 200


def test_many_apps_in_one_process_each_mount_the_dashboard(config, conn):
    settings = dataclasses.replace(config, dashboard_password="pw")
    clients = [create_app(settings, conn=conn).test_client() for _ in range(3)]
    assert [c.get("/rq/", headers=basic("admin", "pw")).status_code for c in clients] == [200, 200, 200]
