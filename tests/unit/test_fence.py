"""Fenced runs (issue 29, finding 2), in process on fakeredis: a run's files are removed only after the
compare-and-set that decided its ending, never a folder the task still names (its checkpoint's, its current
run's, its result's), and a run's ending is one decision: the stop grace's put-back that loses to the
completion does nothing. The fork worker's ``on_stopped`` and run again remove only folders that existed
before, and none the task names. The real-process case (a SIGSTOPped run that wakes after the run that
resumed in its folder completed) is tests/integration/test_claims.py's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.core.clock import now_ms
from app.core.config import Config
from app.core.ids import new_run_id
from app.core.results import LocalResultStore
from app.core.states import TaskStatus
from app.web import create_app
from app.web.errors import Conflict
from app.web.rerun import run_again
from app.web.service import TaskService
from tests.unit.test_runner import API, hooks, registering
from workers import heartbeat
from workers import runner as runner_module
from workers.context import TaskContext
from workers.endings import COMPLETED
from workers.exceptions import TaskError
from workers.runner import Runner


def writes_a_file(payload: dict, ctx: TaskContext) -> dict:
    with ctx.results.writer(ctx.task_id, "out.txt") as fh:
        fh.write(b"the result")
    return {"file": {"name": "out.txt", "size": 10, "content_type": "text/plain"}}


def checkpoints_then_refuses(payload: dict, ctx: TaskContext) -> dict:
    with ctx.results.writer(ctx.task_id, "part.csv") as fh:
        fh.write(b"a,b\n")
    ctx.save_cursor({"rows": 1})
    ctx.flush()
    hooks["step"](ctx.task_id)
    raise TaskError(10001, "refused after the take-over")


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    yield from registering(monkeypatch, {"fence.file": (writes_a_file, 0),
                                         "fence.refuse": (checkpoints_then_refuses, 0)})


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, progress_interval=0,
                           heartbeat_interval=3600)


@pytest.fixture
def runner(config: Config, conn: Any) -> Runner:
    return Runner(config, conn)


@pytest.fixture
def client(config: Config, conn: Any) -> Any:
    return create_app(config, conn=conn).test_client()


def submit(client: Any, task_type: str) -> str:
    r = client.post(API, json={"type": task_type, "payload": {}})
    assert r.status_code == 202, r.get_json()
    return str(r.get_json()["task_id"])


def folders(config: Config, task_id: str) -> dict[str, list[str]]:
    """Each run folder of the task (by run id) with its files."""
    root = config.results_dir / task_id
    return {p.name.removeprefix("run-"): sorted(f.name for f in p.iterdir()) for p in sorted(root.glob("run-*"))}


def write(config: Config, task_id: str, run_id: str, name: str) -> None:
    with LocalResultStore(config.results_dir).for_run(run_id).writer(task_id, name) as fh:
        fh.write(b"x")


def test_a_put_back_after_the_stop_grace_that_loses_to_the_completion_removes_nothing(client, runner, config,
                                                                                       monkeypatch):
    # the stop grace ran out while the run was completing: the put-back's compare-and-set lost to the completion,
    # and its discard removed the COMPLETED task's result folder
    ended: list[int] = []
    monkeypatch.setattr(heartbeat, "_end_process", ended.append)
    complete = runner.store.complete

    def complete_then_grace_over(*args: Any, **kwargs: Any) -> bool:
        done = complete(*args, **kwargs)
        beat = runner.current
        assert beat is not None
        grace_over = threading.Thread(target=beat._overdue, args=(0.0,))  # what interrupt() starts, due now
        grace_over.start()
        grace_over.join()
        return done

    monkeypatch.setattr(runner.store, "complete", complete_then_grace_over)
    task_id = submit(client, "fence.file")
    assert runner.run(task_id) == COMPLETED
    assert client.get(f"{API}/{task_id}").get_json()["status"] == TaskStatus.COMPLETED
    file = client.get(f"{API}/{task_id}/result/file")
    assert file.status_code == 200 and file.data == b"the result"
    file.close()  # the file handle send_file opened
    assert ended == []  # the completion ended the run: the grace's path did not act, nor end the process


def test_a_run_that_fails_after_a_take_over_leaves_the_folder_the_new_run_resumed_in(client, runner, config):
    # run A saved a checkpoint; recovery handed the task to run B, which resumes in A's folder; A then raised a
    # TaskError. Its fail's compare-and-set loses, and it must not remove that folder (it removed it first)
    task_id = submit(client, "fence.refuse")
    new_run = new_run_id()

    def take_over(tid: str) -> None:
        task = runner.store.get(tid)
        assert task is not None and task.checkpoint_run is not None
        assert runner.store.recover(task, now_ms() + 1000) == TaskStatus.PENDING
        assert runner.store.start(tid, new_run).started is not None

    old_folder = None

    def step(tid: str) -> None:
        nonlocal old_folder
        old_folder = runner.store.get(tid).checkpoint_run
        take_over(tid)

    hooks["step"] = step
    assert runner.run(task_id) is None  # not its task any more: nothing recorded
    task = runner.store.get(task_id)
    assert task is not None and task.status == TaskStatus.PROCESSING and task.run_id == new_run
    assert task.checkpoint_run == old_folder and folders(config, task_id) == {old_folder: ["part.csv"]}


def test_on_stopped_after_the_task_ran_again_keeps_the_new_runs_folder(client, runner, config):
    # RQ calls on_stopped once it killed a cancelled task's work horse; by then the task may run again. It
    # removed every run's folder of the task, the new run's too
    runner_module.use(runner)
    task_id = submit(client, "fence.file")
    old_run, new_run = new_run_id(), new_run_id()
    assert runner.store.start(task_id, old_run).started is not None
    write(config, task_id, old_run, "partial.csv")
    assert client.delete(f"{API}/{task_id}").status_code == 204
    assert client.post(f"{API}/{task_id}/retry").status_code == 202
    assert runner.store.start(task_id, new_run).started is not None
    write(config, task_id, new_run, "partial.csv")
    write(config, task_id, old_run, "late.csv")  # what the killed horse wrote last
    runner_module.on_stopped(SimpleNamespace(args=[task_id]), runner.store.redis)
    assert folders(config, task_id) == {new_run: ["partial.csv"]}


def test_a_run_again_that_loses_its_compare_and_set_removes_nothing(client, runner, config, conn):
    # two run-agains of one FAILED task: the second, which read the task while it was FAILED, removed the files
    # before its compare-and-set, so those of the run the first one started
    task_id = submit(client, "fence.file")
    old_run, new_run = new_run_id(), new_run_id()
    assert runner.store.start(task_id, old_run).started is not None
    write(config, task_id, old_run, "partial.csv")
    assert runner.store.fail(task_id, old_run, 10001, "refused")
    stale = runner.store.get(task_id)
    service, results = TaskService(conn, config), LocalResultStore(config.results_dir)
    assert run_again(service, results, stale).status == TaskStatus.PENDING
    assert folders(config, task_id) == {}  # the failed run's folder went, once the run again had won
    assert runner.store.start(task_id, new_run).started is not None
    write(config, task_id, new_run, "partial.csv")
    with pytest.raises(Conflict):
        run_again(service, results, stale)
    assert folders(config, task_id) == {new_run: ["partial.csv"]}
