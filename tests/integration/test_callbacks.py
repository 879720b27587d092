"""Callbacks with real processes (issue 21, point 4): a real Redis, a scheduler (whose tick claims the due
deliveries) and a deliverer (``python -m app.launch.cli deliverer``, an RQ worker on the callbacks queue), and a
receiver on loopback, allowed by TASKPORT_CALLBACK_ALLOW_HOSTS=127.0.0.1.

The delivery tests create their task through TaskStore with its callback fields (tests.unit.test_callbacks
.due_task) and cancel it, so the transition script makes its delivery due; the end-to-end tests submit over HTTP
to a web and a worker of the same stack, a task and a batch with a ``callback``, and follow them to the receiver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rq import Worker
from standardwebhooks import Webhook

from app.core import keys
from app.core.states import CALLBACK_QUEUE
from tests.integration.harness import Api, RedisServer, Stack, wait_ready, wait_until
from tests.unit.test_callbacks import SECRET, Receiver, callback_fields, due_task, target_of


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("callbacks")
    server = RedisServer(workdir / "redis").start()
    s = Stack(server.url, workdir / "stack", callback_secrets=f"public:{SECRET}", callback_allow_hosts="127.0.0.1")
    try:
        start_with_deliverer(s)
        yield s
    finally:
        s.teardown()
        server.close()


def start_with_deliverer(s: Stack) -> None:
    """Web, worker, scheduler and a deliverer, once the deliverer listens on the callbacks queue."""
    s.start_web()
    s.start_worker()
    s.start_scheduler()
    deliverer = s.spawn("deliverer", "--name", "deliverer-1", name="deliverer")
    conn = s.redis()
    wait_ready([deliverer], lambda: any(CALLBACK_QUEUE in w.queue_names() for w in Worker.all(connection=conn)),
               30, "the deliverer to register on the callbacks queue")
    conn.close()


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(*statuses: int) -> Receiver:
        made.append(Receiver(statuses))
        return made[-1]

    yield make
    for r in made:
        r.close()


def ended(conn: Any, task_id: str) -> Callable[[], tuple[str, int, str] | None]:
    """A predicate for wait_until: the task's callback fields once its delivery is no longer pending."""
    def check() -> tuple[str, int, str] | None:
        fields = callback_fields(conn, task_id)
        return fields if fields[0] != "pending" else None

    return check


def test_a_receiver_answering_500_twice_gets_the_same_signed_delivery_three_times(
        stack: Stack, receiver: Callable[..., Receiver]) -> None:
    hook = receiver(500, 500, 200)
    conn = stack.redis()
    did = due_task(conn, stack.config, hook.url("/hooks/taskport"))
    task_id = target_of(did)
    final = wait_until(ended(conn, task_id), timeout=20, interval=0.1,
                       message=lambda: f"the delivery to end; receiver got {len(hook.got)}\n{stack.log_tails()}")
    assert final == ("delivered", 3, "200")
    assert len(hook.got) == 3 and {h["webhook-id"] for h, _, _ in hook.got} == {did}
    assert len({body for _, body, _ in hook.got}) == 1  # the same bytes every time
    assert len({h["webhook-signature"] for h, _, _ in hook.got}) == 3  # signed afresh each time
    for headers, body, _ in hook.got:
        document = Webhook(SECRET).verify(body, headers)
        assert document["task_id"] == task_id and document["status"] == "CANCELLED"
    gaps = [later - earlier for earlier, later in zip(hook.times, hook.times[1:], strict=False)]
    assert 0.9 < gaps[0] < 3 and 4.5 < gaps[1] < 7, gaps  # retries about 1 s, then 5 s, after
    assert conn.zscore(keys.CALLBACKS_DUE, did) is None and not conn.exists(keys.delivery(did))
    log = next(p for p in stack.procs if p.role == "deliverer").log()
    lines = [line for line in log.splitlines() if did in line]
    assert len(lines) == 3 and all(f"task_id={task_id}" in line for line in lines), log  # one line per attempt
    assert "delivered to 127.0.0.1 (HTTP 200, attempt 3)" in lines[-1] and "Traceback" not in log


def test_a_host_that_resolves_to_a_non_public_address_is_refused_at_delivery_with_no_request(
        stack: Stack, receiver: Callable[..., Receiver]) -> None:
    hook = receiver(200)
    conn = stack.redis()
    # localhost is loopback and not in TASKPORT_CALLBACK_ALLOW_HOSTS (127.0.0.1 is): the deliverer must refuse it
    # after resolving it, so the receiver behind that address must see no connection at all
    did = due_task(conn, stack.config, hook.url(scheme="https", host="localhost"))
    task_id = target_of(did)
    final = wait_until(ended(conn, task_id), timeout=20, interval=0.1,
                       message=lambda: f"the delivery to be refused\n{stack.log_tails()}")
    assert final == ("failed", 0, "")
    assert hook.connections == 0 and hook.got == []
    assert conn.zscore(keys.CALLBACKS_DUE, did) is None
    log = next(p for p in stack.procs if p.role == "deliverer").log()
    assert f"callback {did} refused, nothing sent: The callback URL's host resolves to a non-public address" in log


def test_a_submitted_task_s_callback_reaches_the_receiver_once_per_event_after_two_500s(
        stack: Stack, receiver: Callable[..., Receiver]) -> None:
    hook = receiver(500, 500, 200)
    with Api(stack.base_url) as api:
        answer = api.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {"steps": 1, "seconds": 0.2},
                                                 "callback": {"url": hook.url("/hooks/task")}})
        assert answer.status_code == 202, answer.text
        task_id = answer.json()["task_id"]
        assert answer.json()["callback"] == {"state": "pending", "attempts": 0, "last_status": None}
        done = wait_until(lambda: (doc := api.status(task_id))["callback"]["state"] == "delivered" and doc,
                          timeout=20, interval=0.1, message=lambda: f"the delivery\n{stack.log_tails()}")
    assert done["status"] == "COMPLETED" and done["callback"] == {"state": "delivered", "attempts": 3,
                                                                  "last_status": 200}
    assert len({h["webhook-id"] for h, _, _ in hook.got}) == 1 and len(hook.got) == 3  # one event, retried
    documents = [Webhook(SECRET).verify(body, headers) for headers, body, _ in hook.got]
    assert {(d["task_id"], d["status"]) for d in documents} == {(task_id, "COMPLETED")}


def test_a_batch_s_callback_is_delivered_once_when_it_is_done(stack: Stack, receiver: Callable[..., Receiver]) -> None:
    hook = receiver(200)
    with Api(stack.base_url) as api:
        tasks = [{"type": "demo.sleep", "payload": {"steps": 1}, "dedup_key": f"cb-{i}"} for i in range(3)]
        answer = api.post("/api/v1/batches", json={"tasks": tasks, "callback": {"url": hook.url("/hooks/batch")}})
        assert answer.status_code == 202, answer.text
        batch_id = answer.json()["batch_id"]
        wait_until(lambda: api.get(f"/api/v1/batches/{batch_id}").json()["callback"]["state"] == "delivered",
                   timeout=20, interval=0.1, message=lambda: f"the batch delivery\n{stack.log_tails()}")
    [(headers, body, path)] = hook.got
    document = Webhook(SECRET).verify(body, headers)
    assert path == "/hooks/batch" and document["batch_id"] == batch_id and document["status"] == "DONE"
    assert document["counts"]["COMPLETED"] == 3


def test_a_callback_to_a_private_or_plain_http_address_is_refused_at_submit(stack: Stack) -> None:
    with Api(stack.base_url) as api:
        for url in ("https://10.0.0.1/hook", "https://localhost/hook", "http://example.com/hook",
                    "https://user:pw@example.com/hook"):
            answer = api.post("/api/v1/tasks", json={"type": "demo.sleep", "payload": {},
                                                     "callback": {"url": url}})
            assert answer.status_code == 422, (url, answer.text)
            assert list(answer.json()["errors"]) == ["callback.url"], (url, answer.json())
        batch = api.post("/api/v1/batches", json={"tasks": [{"type": "demo.sleep", "payload": {}}],
                                                  "callback": {"url": "https://192.168.1.1/x"}})
        assert batch.status_code == 422 and list(batch.json()["errors"]) == ["callback.url"], batch.text


# minutes of real processes and timeouts: `make test-slow` (CI runs it), which keeps `make test` within its budget
pytestmark = pytest.mark.slow
