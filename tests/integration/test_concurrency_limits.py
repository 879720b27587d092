"""Concurrency limits with real workers on a real server (issue 31): with TASKPORT_CONCURRENCY=demo.sleep=2/member,
ten tasks of one member never run more than two at once (read from their started_at and completed_at), another
member's run beside them, a parked task's status says why it waits; and a worker killed while it holds a slot
frees it within the stall timeout (``faults``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import datetime

import pytest

from app.core import keys, limits
from tests.integration.harness import Api, Stack, started_stack, wait_until

KEYS = "ka:acme,kb:bob"


def at(doc: dict, field: str) -> float:
    return datetime.fromisoformat(doc[field]).timestamp()


def most_at_once(docs: list[dict]) -> int:
    """The most runs that overlapped at any moment, from their started_at and completed_at."""
    edges = sorted([(at(d, "started_at"), 1) for d in docs] + [(at(d, "completed_at"), -1) for d in docs])
    running = most = 0
    for _, step in edges:  # an end before a start at the same instant: the ends sort first (-1 < 1)
        running += step
        most = max(most, running)
    return most


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with started_stack(tmp_path_factory.mktemp("concurrency"), worker=False, api_keys=KEYS,
                       concurrency="demo.sleep=2/member") as s:
        s.start_worker(4)
        s.start_scheduler()
        yield s


def test_ten_tasks_of_one_member_never_run_more_than_two_at_once_and_another_member_runs_beside(
        stack: Stack) -> None:
    with Api(stack.base_url, "ka") as acme, Api(stack.base_url, "kb") as bob:
        mine = [acme.create("demo.sleep", {"seconds": 0.6, "steps": 3}, dedup_key=uuid.uuid4().hex)
                for _ in range(10)]
        parked = wait_until(lambda: next((d for d in map(acme.status, mine) if d["waiting_for"]), None),
                            timeout=10, message="a parked task of acme")
        assert parked["status"] == "PENDING" and parked["started_at"] is None and parked["attempts"] == 0
        assert parked["waiting_for"] == ["concurrency: demo.sleep member acme 2/2"]
        theirs = bob.create("demo.sleep", {"seconds": 0.6, "steps": 3}, dedup_key=uuid.uuid4().hex)
        done = [acme.wait_for(t, "COMPLETED", timeout=30) for t in mine]
        other = bob.wait_for(theirs, "COMPLETED", timeout=30)
    assert most_at_once(done) == 2
    assert all(d["attempts"] == 1 and d["waiting_for"] is None for d in done)  # parked runs used no attempt
    last_end = max(at(d, "completed_at") for d in done)
    assert at(other, "completed_at") < last_end - 0.6  # bob's ran while acme's were still running
    conn = stack.redis()
    assert conn.hlen(keys.LIMITS) == 0 and conn.zcard(keys.LIMIT_READY) == 0  # every slot given back
    assert limits.in_use(conn) == {}


@pytest.mark.faults
def test_a_worker_killed_while_it_holds_a_slot_frees_it_within_the_stall_timeout(tmp_path) -> None:
    stall = 3.0
    with started_stack(tmp_path, worker=False, concurrency="demo.sleep=1/member", stall_timeout=stall,
                       heartbeat_interval=0.5) as stack, Api(stack.base_url) as api:
        holder = stack.start_worker(1, name="holder")
        stack.start_scheduler()
        long = api.create("demo.sleep", {"seconds": 60, "steps": 60}, dedup_key=uuid.uuid4().hex)
        api.wait_for(long, "PROCESSING")
        stack.start_worker(1, name="other")
        waiting = api.create("demo.sleep", {"seconds": 0, "steps": 1}, dedup_key=uuid.uuid4().hex)
        wait_until(lambda: api.status(waiting)["waiting_for"], timeout=10, message="the second task parked")
        stack.kill9(holder)
        killed = time.time()
        done = api.wait_for(waiting, "COMPLETED", timeout=stall + limits.SWEEP_EVERY + 10)
        freed = at(done, "started_at") - killed
        # the slot lapses stall s after the last heartbeat; the scheduler's sweep finds it within SWEEP_EVERY s,
        # and its tick queues the released task within half a second
        assert freed < stall + limits.SWEEP_EVERY + 1.5, (freed, stack.log_tails())
