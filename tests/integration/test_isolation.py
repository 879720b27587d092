"""Tenant isolation as a matrix: every task route × (owner, other member, no key, wrong key).

One stack with API keys (alice, bob) and a real worker. alice owns a finished export (so the result and
its file exist). The rule under test: another member's answer is exactly an unknown id's (status, body,
content type), a caller without a valid key gets 401 everywhere, and nothing the others do changes the
owner's task.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.integration.harness import TASKS, Api, Stack, started_stack

KEYS = "ka:alice,kb:bob"
CALLERS = {"owner": "ka", "other": "kb", "no key": None, "wrong key": "kz"}
EXPORT = {"rows": 50, "format": "csv", "start_date": "2026-03-01", "end_date": "2026-03-02"}
# (route, method, suffix) of every route that names a task by id
TASK_ROUTES = [("status", "GET", ""), ("result", "GET", "/result"), ("result file", "GET", "/result/file"),
               ("events", "GET", "/events"), ("cancel", "DELETE", "")]
OWNER_STATUS = {"status": 200, "result": 200, "result file": 200, "events": 200, "cancel": 409}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("isolation"), api_keys=KEYS) as s:
        yield s


@pytest.fixture(scope="module")
def clients(stack: Stack) -> Iterator[dict[str, Api]]:
    made = {who: Api(stack.base_url, key) for who, key in CALLERS.items()}
    yield made
    for client in made.values():
        client.close()


@pytest.fixture(scope="module")
def owned(clients: dict[str, Api]) -> dict[str, Any]:
    """alice's finished export and the dedup key she used for it."""
    dedup_key = f"iso-{uuid.uuid4().hex}"
    task_id = clients["owner"].create("orders.export", EXPORT, dedup_key=dedup_key)
    clients["owner"].wait_for(task_id, "COMPLETED")
    return {"task_id": task_id, "dedup_key": dedup_key}


def call(client: Api, method: str, path: str) -> requests.Response:
    # An event stream of a finished task sends its snapshot and ends; read it whole.
    return client.request(method, path, timeout=(3, 5))


def shape(response: requests.Response) -> tuple[int, str, Any]:
    return response.status_code, response.headers.get("Content-Type", ""), response.json()


@pytest.mark.parametrize("who", list(CALLERS))
@pytest.mark.parametrize("route, method, suffix", TASK_ROUTES, ids=[r[0] for r in TASK_ROUTES])
def test_task_routes(clients: dict[str, Api], owned: dict[str, Any], who: str, route: str, method: str,
                     suffix: str) -> None:
    client, task_id = clients[who], owned["task_id"]
    response = call(client, method, f"{TASKS}/{task_id}{suffix}")
    if who == "owner":
        assert response.status_code == OWNER_STATUS[route], (route, response.status_code, response.text)
    elif who == "other":
        unknown = call(client, method, f"{TASKS}/{uuid.uuid4()}{suffix}")
        assert shape(response) == shape(unknown)
        assert response.status_code == 404
    else:
        assert response.status_code == 401
        assert response.headers["Content-Type"].startswith("application/problem+json")
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    assert clients["owner"].status(task_id)["status"] == "COMPLETED"  # nobody's call changed the task


@pytest.mark.parametrize("who", list(CALLERS))
def test_history(clients: dict[str, Api], owned: dict[str, Any], who: str) -> None:
    response = clients[who].get(TASKS)
    if who in ("no key", "wrong key"):
        assert response.status_code == 401
        return
    assert response.status_code == 200
    ids = [t["task_id"] for t in response.json()["tasks"]]
    assert (owned["task_id"] in ids) is (who == "owner")


@pytest.mark.parametrize("who", list(CALLERS))
def test_dedup_keys_are_per_member(clients: dict[str, Api], owned: dict[str, Any], who: str) -> None:
    response = clients[who].submit("orders.export", EXPORT, dedup_key=owned["dedup_key"])
    if who == "owner":
        assert response.status_code == 409
        assert response.json()["task_id"] == owned["task_id"]
    elif who == "other":
        assert response.status_code == 202  # bob's own task: alice's key means nothing to him
        assert response.json()["task_id"] != owned["task_id"]
    else:
        assert response.status_code == 401
