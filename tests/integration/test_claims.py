"""No run outlives its claim, with real processes: a real RQ worker's work horse is stopped (SIGSTOP, as a
GIL-holding C call or a starved CPU would stall it), housekeeping's recovery takes its task over, and
the horse is continued (SIGCONT). Both orders:

- the old run wakes up before the re-queued job starts (one worker: the job waits for it). Before the
  fix, RQ's cleanup of the old delivery (``result_ttl=0``) deleted the re-queued job of the same id and
  the task stayed PENDING;
- the old run wakes up after a second worker ran the re-queued job to COMPLETED. Before the fix, the
  old run's heartbeat was answered PROCESSING (the new run's), and on its way out it deleted the new
  run's result folder.

The old run must stop at its next heartbeat and touch nothing of the new run: its files, its job.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from app.core import processors
from app.core.config import Config
from tests.integration.harness import TASKS, Api, Proc, Stack, wait_until
from workers.housekeeping import Housekeeper, PassReport

MODULE = "tests.userprocs.claims"


@pytest.fixture
def claims(stack: Stack) -> Stack:
    # fork: a run is told apart by its pid-thread, which two runs in one in-process worker would share
    stack.configure(processors=MODULE, heartbeat_interval=0.2, progress_interval=0.1, stall_timeout=1.0,
                    worker_class="fork")
    processors.load([MODULE])  # the recovery pass runs in this process
    stack.start_web()
    return stack


def announced(api: Api, task_id: str, not_who: str | None = None) -> str:
    """Who runs the task (``<pid>-<thread>``), once a run other than ``not_who`` has announced itself."""
    def who() -> str | None:
        message = api.status(task_id)["message"] or ""
        found = message.removeprefix("who ")
        return found if message.startswith("who ") and found != not_who else None

    return wait_until(who, timeout=20, message=f"a run of {task_id} to announce itself")


def recover(config: Config, conn: redis.Redis) -> None:
    """Run the recovery pass until it takes the stalled task (its heartbeat must age past the timeout)."""
    keeper = Housekeeper(conn, config)

    def once() -> bool:
        report = PassReport("recover")
        keeper.recover(report)
        return report.counts.get("recovered_to_pending") == 1

    wait_until(once, timeout=15, interval=0.1, message="recovery to take the stalled task")


def horse_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def file_of(api: Api, task_id: str) -> bytes:
    response = api.get(f"{TASKS}/{task_id}/result/file")
    assert response.status_code == 200, response.text
    return response.content


def run_folders(config: Config, task_id: str) -> list[Path]:
    return sorted((config.results_dir / task_id).glob("run-*"))


def stalled_run(api: Api, gate: Path, task_type: str = "test.gated") -> tuple[str, str, int]:
    task_id = api.create(task_type, {"gate": str(gate)})
    old_who = announced(api, task_id)
    pid = int(old_who.split("-")[0])
    os.kill(pid, signal.SIGSTOP)
    return task_id, old_who, pid


def taken_over(claims: Stack, conn: redis.Redis, api: Api, gate: Path, task_id: str,
               old_who: str) -> tuple[str, dict[str, Any]]:
    """The stalled run's claim recovered and a second worker ("second") started, which takes the task and runs
    it to its end: (the new run's name, the task then)."""
    recover(claims.config, conn)
    claims.start_worker(name="second")
    new_who = announced(api, task_id, not_who=old_who)
    (gate / new_who).touch()
    return new_who, api.wait_for(task_id, "COMPLETED", "FAILED", timeout=20)


def old_run_stopped(api: Api, first: Proc, pid: int, task_id: str, new_who: str) -> None:
    """The old run (``pid``, of worker ``first``), woken after the new run completed, is told at its next
    heartbeat that its claim was taken and stops at its next checkpoint, leaving the task as it was."""
    wait_until(lambda: horse_gone(pid), timeout=20, message=lambda: f"the old run to stop\n{first.describe()}")
    wait_until(lambda: "taken over by another run" in first.log(), timeout=10, message="the old run's log line")
    assert api.status(task_id)["status"] == "COMPLETED"
    assert file_of(api, task_id) == new_who.encode()  # the new run's file survived the old run's exit


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    folder = tmp_path / "gate"
    folder.mkdir()
    return folder


@pytest.fixture
def conn(claims: Stack) -> Iterator[redis.Redis]:
    client = claims.redis()
    yield client
    client.close()


def test_old_run_wakes_up_before_the_requeued_job_starts(claims: Stack, gate: Path, conn: redis.Redis) -> None:
    claims.start_worker(name="only")
    with Api(claims.base_url) as api:
        task_id, old_who, pid = stalled_run(api, gate)
        try:
            recover(claims.config, conn)
            assert api.status(task_id)["status"] == "PENDING"
        finally:
            os.kill(pid, signal.SIGCONT)
        # the old run stops at its next heartbeat; its delivery ends and RQ deletes its job, not the new one;
        # the same worker then takes the re-queued job
        new_who = announced(api, task_id, not_who=old_who)
        assert horse_gone(pid)
        (gate / new_who).touch()
        done = api.wait_for(task_id, "COMPLETED", "FAILED", timeout=20)
        assert done["status"] == "COMPLETED" and done["attempts"] == 1, done  # the lost run gave its attempt back
        assert file_of(api, task_id) == new_who.encode()
    assert len(run_folders(claims.config, task_id)) == 1


def test_old_run_wakes_up_after_the_new_run_completed(claims: Stack, gate: Path, conn: redis.Redis) -> None:
    [first] = claims.start_worker(name="first")
    with Api(claims.base_url) as api:
        task_id, old_who, pid = stalled_run(api, gate)
        try:
            new_who, done = taken_over(claims, conn, api, gate, task_id, old_who)
            assert done["status"] == "COMPLETED" and done["attempts"] == 1, done
            assert file_of(api, task_id) == new_who.encode()
        finally:
            os.kill(pid, signal.SIGCONT)
        old_run_stopped(api, first, pid, task_id, new_who)
    assert len(run_folders(claims.config, task_id)) == 1



def test_old_run_wakes_up_after_the_new_run_resumed_in_its_folder_and_completed(claims: Stack, gate: Path,
                                                                               conn: redis.Redis) -> None:
    # the old run saved a checkpoint, so the new run resumes in the old run's folder and completes there.
    # Before the fence, the old run, told the task was no longer its own, removed that folder (it was the one
    # it had created, and the COMPLETED task no longer "resumed" in it): the result file was gone.
    [first] = claims.start_worker(name="first")
    with Api(claims.base_url) as api:
        task_id, old_who, pid = stalled_run(api, gate, "test.gated_resumable")
        try:
            new_who, done = taken_over(claims, conn, api, gate, task_id, old_who)
            assert done["status"] == "COMPLETED" and done["resumed"] == 1, done
            [folder] = run_folders(claims.config, task_id)  # one folder: the old run's, the new run's result in it
            assert file_of(api, task_id) == new_who.encode()
        finally:
            os.kill(pid, signal.SIGCONT)
        old_run_stopped(api, first, pid, task_id, new_who)
    assert run_folders(claims.config, task_id) == [folder]


def test_an_output_that_cannot_be_stored_fails_minus_1_at_once(claims: Stack) -> None:
    claims.start_worker()
    with Api(claims.base_url) as api:
        task_id = api.create("test.unstorable", {"kind": "object"})
        done = api.wait_for(task_id, "FAILED", "COMPLETED", timeout=15)  # no scheduler: only the run can end it
        assert done["status"] == "FAILED" and done["error"]["code"] == -1 and done["attempts"] == 1, done


def test_a_task_past_its_ttl_never_starts(stack: Stack) -> None:
    stack.configure(task_ttl=1)
    stack.start_web()
    with Api(stack.base_url) as api:
        task_id = api.create("demo.sleep", {"steps": 1})
        wait_until(lambda: api.get(f"{TASKS}/{task_id}").status_code == 410, timeout=30, message="EXPIRED")
        [worker] = stack.start_worker()
        wait_until(lambda: "delivery ignored: task is EXPIRED" in worker.log(), timeout=15,
                   message=lambda: f"the late delivery to be refused\n{worker.describe()}")
        response = api.get(f"{TASKS}/{task_id}")
        assert response.status_code == 410 and response.json()["status"] == "EXPIRED"
        assert response.json()["error"]["code"] == -4 and response.json()["progress"] == 0
