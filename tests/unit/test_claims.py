"""A run whose claim housekeeping took (its heartbeat looked stale) stops at its next checkpoint and
touches nothing of the run that took over: not its result files, not its RQ job. Both orders: the old
run ends before the new one starts, and the old run wakes up after the new one completed.

Runs are threads here (fakeredis); the stall is simulated by running recovery with a clock past the
stall timeout, the heartbeat thread being kept quiet by a long interval. tests/integration/test_claims.py
does the same with real processes, a real SIGSTOP and real RQ workers.
"""

from __future__ import annotations

import logging
import threading
import uuid
from pathlib import Path

import pytest
from rq import SimpleWorker
from rq.job import Job

from app.core.answers import NewTask
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.states import CLAIM_TAKEN, QUEUES, TaskStatus
from app.core.store import TaskStore
from app.web.service import TaskService
from tests.integration.harness import wait_until
from tests.userprocs.claims import who
from workers import runner as runner_module
from workers.endings import RunEnd
from workers.housekeeping import Housekeeper, PassReport
from workers.runner import Runner

MODULE = "tests.userprocs.claims"


@pytest.fixture
def config(tmp_path: Path) -> Config:
    # no heartbeat during the test (the stall is simulated); every progress call writes
    return Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, processors=MODULE,
                           heartbeat_interval=3600, progress_interval=0)


@pytest.fixture
def runner(conn, config) -> Runner:
    return Runner(config, conn)


def submit(conn, config: Config, gate: Path, explode: bool = False) -> str:
    store, jobs = TaskStore(conn, config), JobQueue(conn, config)
    payload = {"gate": str(gate), "explode": explode}
    new = NewTask(task_id=str(uuid.uuid4()), member="public", type="test.gated", payload=payload,
                  dedup_digest=uuid.uuid4().hex, priority="default", max_attempts=2)
    store.create(new, jobs.job_commands(new.task_id, "default", 60))
    return new.task_id


def start_run(runner: Runner, task_id: str) -> tuple[threading.Thread, str]:
    """Run one delivery in a thread; returns it and who runs it, once the run has announced itself."""
    seen = {m for m in [runner.store.get(task_id).message] if m}
    thread = threading.Thread(target=runner.run, args=(task_id,), daemon=True)
    thread.start()
    message = wait_until(lambda: (m := runner.store.get(task_id).message) and m.startswith("who ") and m not in seen
                         and m, timeout=10, message="the run to start")
    return thread, message.removeprefix("who ")


def recover_stalled(conn, config: Config) -> None:
    """Housekeeping's recovery pass as it runs once the heartbeat is older than the stall timeout."""
    report = PassReport("recover")
    Housekeeper(conn, config).recover(report, now=now_ms() + int(config.stall_timeout * 1000) + 60_000)
    assert report.counts == {"recovered_to_pending": 1}


def release(gate: Path, who: str) -> None:
    (gate / who).touch()


def run_folders(config: Config, task_id: str) -> list[Path]:
    return sorted((config.results_dir / task_id).glob("run-*"))


def test_old_run_wakes_after_the_new_run_completed(conn, config, runner, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    task_id = submit(conn, config, gate)
    old, old_who = start_run(runner, task_id)
    recover_stalled(conn, config)
    assert runner.store.report(task_id, runner.store.get(task_id).run_id or "x", None) == CLAIM_TAKEN

    new, new_who = start_run(runner, task_id)
    assert runner.store.get(task_id).attempts == 1  # the lost run gave its attempt back
    release(gate, new_who)
    new.join(10)
    task, stored = runner.store.get_with_result(task_id)
    assert task is not None and task.status == TaskStatus.COMPLETED and stored is not None
    assert stored["result"]["who"] == new_who

    release(gate, old_who)  # the old run wakes up: its next checkpoint is told the claim is taken
    old.join(10)
    assert not old.is_alive()
    task, stored = runner.store.get_with_result(task_id)
    assert task is not None and task.status == TaskStatus.COMPLETED and stored["result"]["who"] == new_who
    # the new run's file is intact and served; the old run removed only its own folder
    with runner.results.for_run(stored["run"]).open(task_id, "out.txt") as fh:
        assert fh.read() == new_who.encode()
    assert run_folders(config, task_id) == [config.results_dir / task_id / f"run-{stored['run']}"]


def test_old_run_ends_before_the_new_run_starts(conn, config, runner, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    task_id = submit(conn, config, gate)
    runner_module.use(runner)  # what the SimpleWorker below runs
    old, old_who = start_run(runner, task_id)
    recover_stalled(conn, config)
    release(gate, old_who)
    old.join(10)
    assert not old.is_alive()
    assert runner.store.get(task_id).status == TaskStatus.PENDING  # the old run wrote nothing
    assert run_folders(config, task_id) == []  # and removed its own half-written file

    # what RQ does when the old delivery ends (result_ttl 0): delete its job. The re-queued one survives.
    Job.fetch(task_id, connection=conn).delete()
    job_id = runner.store.job_id(task_id)
    assert job_id != task_id and Job.exists(job_id, connection=conn)
    new_who = who()  # the new run goes on in this thread: open its gate beforehand
    release(gate, new_who)
    SimpleWorker([JobQueue(conn, config).queues[q] for q in QUEUES], connection=conn).work(burst=True)
    task, stored = runner.store.get_with_result(task_id)
    assert task is not None and task.status == TaskStatus.COMPLETED and task.attempts == 1
    with runner.results.for_run(stored["run"]).open(task_id, "out.txt") as fh:
        assert fh.read() == new_who.encode()


@pytest.mark.parametrize("payload", [{"kind": "object"}, {"kind": "big", "size": 2000}])
def test_an_output_that_cannot_be_stored_fails_minus_1_at_once(conn, tmp_path, payload, caplog):
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, processors=MODULE, max_result=1000)
    runner = Runner(config, conn)
    store, jobs = TaskStore(conn, config), JobQueue(conn, config)
    new = NewTask(task_id=str(uuid.uuid4()), member="public", type="test.unstorable", payload=payload,
                  dedup_digest=uuid.uuid4().hex, priority="default", max_attempts=3)
    store.create(new, jobs.job_commands(new.task_id, "default", 60))
    # no retry (the same output would come back): FAILED -1, as RQ will file it, never a traceback
    assert runner.run(new.task_id) == RunEnd(TaskStatus.FAILED, -1, "processing error, please retry later")
    task = store.get(new.task_id)
    assert task is not None and (task.status, task.error_code, task.attempts) == (TaskStatus.FAILED, -1, 1)
    assert task.error_message == "processing error, please retry later"
    logged = [r for r in caplog.records if "cannot be stored" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is None  # a known condition: one line, no traceback


def test_cancel_and_a_stopped_horse_act_on_the_requeued_job(conn, config, runner, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    task_id = submit(conn, config, gate)
    JobQueue(conn, config).remove(task_id)  # a worker took the first job (the run below stands for it)
    old, old_who = start_run(runner, task_id)
    recover_stalled(conn, config)
    release(gate, old_who)
    old.join(10)
    job_id = runner.store.job_id(task_id)
    assert Job.exists(job_id, connection=conn)
    TaskService(conn, config).cancel("public", task_id)  # PENDING: its queued job is the re-queued one
    assert not Job.exists(job_id, connection=conn) and JobQueue(conn, config).queues["default"].job_ids == []

    with runner.results.for_run(uuid.uuid4().hex).writer(task_id, "left.txt") as fh:
        fh.write(b"partial")
    runner_module.use(runner)
    runner_module.on_stopped(Job.create("workers.runner.run_task", args=(task_id,), id=job_id, connection=conn), conn)
    assert not (config.results_dir / task_id).exists()  # RQ names the job; the task is its argument


def test_an_exception_in_a_run_that_lost_its_claim_is_a_quiet_stop(conn, config, runner, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    gate = tmp_path / "gate"
    gate.mkdir()
    task_id = submit(conn, config, gate, explode=True)
    old, old_who = start_run(runner, task_id)
    recover_stalled(conn, config)
    release(gate, old_who)
    old.join(10)
    assert not old.is_alive()
    task = runner.store.get(task_id)
    assert task is not None and (task.status, task.attempts) == (TaskStatus.PENDING, 0)  # the recovery stands, for free
    assert not any("processor raised" in r.getMessage() or r.exc_info for r in caplog.records)
    assert any("taken over by another run" in r.getMessage() for r in caplog.records)
