"""The batch calls of the Python client (taskport/batches.py) and ``taskport batch ...`` (taskport/batches_cli.py)
against the real stack: gunicorn, a real RQ worker, the scheduler (whose promote tick queues a batch's ``then``
task once the batch is done) and a real redis-server. The CLI runs as a real process, configured only by
TASKPORT_URL, as tests/integration/test_clients.py runs it."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from taskport import Client, InvalidRequest, NotFound
from taskport import cli as tcli
from tests.integration.harness import Stack, started_stack
from tests.integration.test_clients import run_cli

SECRET = "whsec_" + base64.b64encode(b"batch clients test secret 32 b!!").decode()
WAIT = 30.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """Open mode (member ``public``, who may ask for callbacks), web + one worker + the scheduler."""
    with started_stack(tmp_path_factory.mktemp("batch-clients"), callback_secrets=f"public:{SECRET}") as s:
        s.start_scheduler()
        yield s


@pytest.fixture
def client(stack: Stack) -> Iterator[Client]:
    with Client(stack.base_url) as c:
        yield c


def sleep(seconds: float = 0, **extra: Any) -> dict[str, Any]:
    """A demo.sleep submit body, unique (a repeat within the dedup window would be a duplicate)."""
    return {"type": "demo.sleep", "payload": {"seconds": seconds, "steps": max(1, int(seconds * 10)), **extra},
            "dedup_key": uuid.uuid4().hex}


def test_a_batch_is_followed_to_done_its_tasks_paged_and_its_then_task_run(client: Client) -> None:
    accepted = client.submit_batch([sleep(0.3), sleep(0, fail_code=20002), sleep(0.2)], then=sleep(0))
    batch_id, then_id = accepted["batch_id"], accepted["then_task_id"]
    assert accepted["status"] == "RUNNING" and accepted["size"] == 3 and then_id
    assert [e["duplicate"] for e in accepted["tasks"]] == [False, False, False]
    docs = list(client.watch_batch(batch_id, timeout=WAIT))
    assert docs[-1]["status"] == "DONE" and docs[-1]["progress"] == 100
    assert [d["progress"] for d in docs] == sorted(d["progress"] for d in docs)
    assert {k: v for k, v in docs[-1]["counts"].items() if v} == {"COMPLETED": 2, "FAILED": 1}
    ids = [e["task_id"] for e in accepted["tasks"]]
    assert [d["task_id"] for d in client.batch_tasks(batch_id, page_size=2)] == ids  # submit order, two pages
    failed = list(client.batch_tasks(batch_id, "FAILED"))
    assert [d["task_id"] for d in failed] == [ids[1]] and failed[0]["batch_id"] == batch_id
    assert client.wait(then_id, timeout=WAIT)["status"] == "COMPLETED"  # queued once all three ended
    assert client.status(then_id)["batch_id"] == batch_id


def test_a_cancelled_batch_cancels_its_tasks_and_its_then_task(client: Client) -> None:
    accepted = client.submit_batch([sleep(30), sleep(30)], then=sleep(0))
    client.cancel_batch(accepted["batch_id"])
    last = list(client.watch_batch(accepted["batch_id"], timeout=WAIT))[-1]
    assert last["status"] == "DONE" and last["counts"]["CANCELLED"] == 2
    assert client.status(accepted["then_task_id"])["status"] == "CANCELLED"


def test_a_bad_task_is_named_by_its_index_and_an_unknown_batch_is_not_found(client: Client) -> None:
    with pytest.raises(InvalidRequest) as refused:
        client.submit_batch([sleep(0), {"type": "demo.sleep", "payload": {"seconds": "soon"}}])
    assert "tasks.1.payload.seconds" in refused.value.errors
    with pytest.raises(InvalidRequest) as private:
        client.submit_batch([sleep(0)], callback="https://10.0.0.1/hook")  # a private address: refused at submit
    assert "callback.url" in private.value.errors
    missing = str(uuid.uuid4())
    with pytest.raises(NotFound):
        client.batch(missing)
    with pytest.raises(NotFound):
        list(client.batch_tasks(missing))
    with pytest.raises(NotFound):
        client.cancel_batch(missing)


def test_a_submit_callback_shows_in_the_status_document_and_a_private_one_is_refused(client: Client) -> None:
    with pytest.raises(InvalidRequest) as private:
        client.submit("demo.sleep", {"seconds": 0}, callback={"url": "https://192.168.1.10/hook"})
    assert "callback.url" in private.value.errors
    with pytest.raises(InvalidRequest) as event:
        client.submit("demo.sleep", {"seconds": 0}, callback={"url": "https://hooks.example/", "events": ["RUNNING"]})
    assert any(name.startswith("callback.events") for name in event.value.errors)


def test_the_cli_submits_follows_lists_and_cancels_a_batch(stack: Stack, tmp_path: Any) -> None:
    path = tmp_path / "batch.json"
    path.write_text(json.dumps({"tasks": [sleep(0.2), sleep(0, fail_code=20002)], "then": sleep(0)}))
    submitted = run_cli(stack.base_url, "batch", "submit", str(path))
    assert submitted.returncode == tcli.OK, submitted.stderr
    batch_id = submitted.stdout.strip()
    assert submitted.stderr.startswith(f"submitted batch {batch_id}: 2 tasks, then ")
    watched = run_cli(stack.base_url, "batch", "watch", batch_id, "--timeout", str(WAIT))
    assert watched.returncode == tcli.FAILED, watched.stderr  # DONE, one task FAILED: its worst task's code
    assert f"batch     {batch_id}" in watched.stdout and "tasks     1 completed, 1 failed of 2" in watched.stdout
    status = run_cli(stack.base_url, "batch", "status", batch_id, "--json")
    assert status.returncode == tcli.FAILED and json.loads(status.stdout)["status"] == "DONE"
    listed = run_cli(stack.base_url, "batch", "tasks", batch_id, "--status", "failed", "--json")
    assert listed.returncode == tcli.OK and [d["status"] for d in json.loads(listed.stdout)] == ["FAILED"]
    missing = run_cli(stack.base_url, "batch", "status", str(uuid.uuid4()))
    assert missing.returncode == tcli.ERROR and missing.stderr.startswith("taskport: error: 404")
    bad = run_cli(stack.base_url, "batch", "submit", str(tmp_path / "nothing.json"))
    assert bad.returncode == tcli.USAGE and "cannot read" in bad.stderr


def test_the_cli_cancels_a_running_batch(stack: Stack, tmp_path: Any) -> None:
    path = tmp_path / "long.json"
    path.write_text(json.dumps({"tasks": [sleep(30)]}))
    batch_id = run_cli(stack.base_url, "batch", "submit", str(path)).stdout.strip()
    still = run_cli(stack.base_url, "batch", "status", batch_id)
    assert still.returncode == tcli.STILL_RUNNING and "status    RUNNING" in still.stdout
    cancelled = run_cli(stack.base_url, "batch", "cancel", batch_id)
    assert (cancelled.returncode, cancelled.stdout) == (tcli.OK, f"cancelled batch {batch_id}\n")
    watched = run_cli(stack.base_url, "batch", "watch", batch_id, "--timeout", str(WAIT), "--json")
    assert watched.returncode == tcli.CANCELLED and json.loads(watched.stdout)["counts"]["CANCELLED"] == 1


# minutes of real processes and timeouts: `make test-slow` (CI runs it), which keeps `make test` within its budget
pytestmark = pytest.mark.slow
