"""Restart survival: stop the web, the workers and Redis (cleanly: the append-only file is complete),
start them again on the same data dir: a finished task is still readable with its result, and a task
that was queued while no worker ran still completes."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.harness import TASKS, Api, RedisServer, Stack

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults


def read(api: Api, task_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    status = api.get(f"{TASKS}/{task_id}")
    result = api.get(f"{TASKS}/{task_id}/result")
    assert status.status_code == 200 and result.status_code == 200, (status.text, result.text)
    return status.json(), result.json()


def test_tasks_survive_a_restart_of_everything(stack: Stack, redis_server: RedisServer) -> None:
    web = stack.start_web()
    workers = stack.start_worker()
    with Api(stack.base_url) as api:
        finished = api.create("orders.split", {"order_code": "O-restart", "items": [
            {"item_code": "A", "quantity": 2}, {"item_code": "B", "quantity": -1}]})
        api.wait_for(finished, "COMPLETED")
        before = read(api, finished)
        assert stack.stop(workers) == [0]
        queued = api.create("demo.sleep", {"steps": 2})
        assert api.status(queued)["status"] == "PENDING"
    assert stack.stop(web) == [0]
    old_pid = redis_server.pid
    redis_server.stop()

    redis_server.start()
    assert redis_server.pid != old_pid
    stack.start_web()
    with Api(stack.base_url) as api:
        assert read(api, finished) == before
        assert before[1]["failures"][0]["item"] == "B" and before[1]["error_code"] == 10002
        assert api.status(queued)["status"] == "PENDING"
        stack.start_worker()
        done = api.wait_for(queued, "COMPLETED")
        assert done["attempts"] == 1
        assert api.get(f"{TASKS}/{queued}/result").json()["result"] == {"slept": 0, "items": 0}
        again = api.submit("orders.split", {"order_code": "O-restart", "items": [
            {"item_code": "A", "quantity": 2}, {"item_code": "B", "quantity": -1}]})
        assert again.status_code == 409 and again.json()["task_id"] == finished  # the dedup key survived too
        listed = [t["task_id"] for t in api.get(TASKS).json()["tasks"]]
        assert listed == [queued, finished]
