"""The dedup race over real HTTP: many identical submits released at once create exactly one task.

Two gunicorn processes with 16 threads each, so the submits really run in parallel (two processes,
two Redis connections at least), each client thread with its own connection.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import pytest
import requests

from tests.integration.harness import TASKS, Api, Stack

CLIENTS = 50
KEYS = {"alice": "ka", "bob": "kb"}


@pytest.fixture
def web(stack: Stack) -> Stack:
    stack.configure(api_keys="ka:alice,kb:bob", web_concurrency=2, web_threads=16)
    stack.start_web()
    stack.start_worker()
    return stack


def race(stack: Stack, submits: list[tuple[str, dict[str, Any]]]) -> list[requests.Response]:
    """POST every (api key, body) from its own thread and session, all released by one barrier."""
    barrier = threading.Barrier(len(submits))
    answers: list[requests.Response | BaseException | None] = [None] * len(submits)
    sessions = [requests.Session() for _ in submits]

    def submit(i: int) -> None:
        key, body = submits[i]
        session = sessions[i]
        session.headers["Authorization"] = f"Bearer {key}"
        try:
            session.get(stack.url("/healthz"), timeout=10)  # connect first: the race is the POST alone
            barrier.wait(timeout=10)
            answers[i] = session.post(stack.url(TASKS), json=body, timeout=30)
        except BaseException as exc:  # reported below, not lost in the thread
            answers[i] = exc

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(submits))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    finally:
        for session in sessions:
            session.close()
    failed = [a for a in answers if not isinstance(a, requests.Response)]
    assert not failed, failed[:3]
    return [a for a in answers if isinstance(a, requests.Response)]


def one_winner(answers: list[requests.Response]) -> str:
    """Exactly one 202; every other answer a 409 naming that task. Returns its id."""
    assert Counter(a.status_code for a in answers) == {202: 1, 409: len(answers) - 1}, \
        Counter(a.status_code for a in answers)
    [created] = [a for a in answers if a.status_code == 202]
    task_id: str = created.json()["task_id"]
    for answer in answers:
        if answer.status_code == 409:
            body = answer.json()
            assert (body["task_id"], body["status"], body["duplicate"]) == (task_id, "DUPLICATE", True)
            assert body["existing"]["task_id"] == task_id
            assert answer.headers["Location"] == f"{TASKS}/{task_id}"
            assert answer.headers["X-Task-Deduplicated"] == "true"
    return task_id


def history(stack: Stack, key: str) -> list[dict[str, Any]]:
    with Api(stack.base_url, key) as client:
        response = client.get(TASKS, params={"limit": 200})
        assert response.status_code == 200, response.text
        tasks: list[dict[str, Any]] = response.json()["tasks"]
        return tasks


def assert_ran_once(stack: Stack, key: str, task_id: str) -> None:
    with Api(stack.base_url, key) as client:
        done = client.wait_for(task_id, "COMPLETED")
    assert done["attempts"] == 1
    assert [t["task_id"] for t in history(stack, key)] == [task_id]
    worker_log = "\n".join(p.log() for p in stack.procs if p.role == "worker")
    assert worker_log.count(f"task_id={task_id} started") == 1


def test_identical_concurrent_submits_create_one_task(web: Stack) -> None:
    body = {"type": "orders.split", "payload": {"order_code": f"O-{uuid.uuid4()}",
                                                "items": [{"item_code": "A", "quantity": 1}]}}
    task_id = one_winner(race(web, [(KEYS["alice"], body)] * CLIENTS))
    assert_ran_once(web, KEYS["alice"], task_id)


def test_concurrent_submits_with_one_explicit_key_create_one_task(web: Stack) -> None:
    key = f"import-{uuid.uuid4()}"
    bodies = [(KEYS["alice"], {"type": "demo.sleep", "payload": {"steps": 1 + i}, "dedup_key": key})
              for i in range(CLIENTS)]  # different payloads: only the key makes them duplicates
    task_id = one_winner(race(web, bodies))
    assert_ran_once(web, KEYS["alice"], task_id)


def test_two_members_racing_each_get_their_own_task(web: Stack) -> None:
    body = {"type": "demo.sleep", "payload": {"steps": 3}, "dedup_key": "same-key-for-both"}
    submits = [(KEYS["alice" if i % 2 else "bob"], body) for i in range(CLIENTS)]
    answers = race(web, submits)
    by_member: dict[str, list[requests.Response]] = {"alice": [], "bob": []}
    for (key, _), answer in zip(submits, answers, strict=True):
        by_member["alice" if key == KEYS["alice"] else "bob"].append(answer)
    winners = {member: one_winner(member_answers) for member, member_answers in by_member.items()}
    assert winners["alice"] != winners["bob"]
    for member, task_id in winners.items():
        assert_ran_once(web, KEYS[member], task_id)
