"""A run interrupted by a worker stop puts its task back without using an attempt, and the next run resumes
from its checkpoint (workers/runner.py, workers/checkpoint.py), on fakeredis; and a lost run whose checkpoint
advanced is recovered for free, up to the point where it stops advancing (app/core/store.py ``recover``)."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from marshmallow import INCLUDE, Schema
from rq import Queue

from app.core import keys, processors
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import resume_job_id
from app.core.states import ErrorCode, TaskStatus
from tests.unit.test_runner import status, submit
from workers import runner as runner_module
from workers.context import TaskContext
from workers.endings import COMPLETED
from workers.runner import Runner

API = "/api/v1/tasks"
calls: list[int] = []
stop_at: dict[str, int] = {}


class AnyPayload(Schema):
    class Meta:
        unknown = INCLUDE


def counted(payload: dict, ctx: TaskContext) -> dict:
    def one(n: int) -> int:
        calls.append(n)
        if n == stop_at.get("item"):
            stop_at.pop("item")
            runner_module.interrupt_current()  # what the worker's SIGTERM handler calls
        return n * 2

    done = ctx.each(range(payload["n"]), one)
    return {"sum": sum(done), "cursor": ctx.cursor}


def with_cursor(payload: dict, ctx: TaskContext) -> dict:
    start = ctx.cursor or 0
    for page in range(start, 5):
        calls.append(page)
        ctx.save_cursor(page + 1)
        if page == stop_at.get("page"):
            stop_at.pop("page")
            runner_module.interrupt_current()
    return {"from": start}


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    processors.load()
    monkeypatch.setattr(processors, "_REGISTRY", dict(processors._REGISTRY))
    processors.processor("rs.counted", schema=AnyPayload, timeout=30)(counted)
    processors.processor("rs.cursor", schema=AnyPayload, timeout=30)(with_cursor)
    calls.clear()
    stop_at.clear()
    yield
    runner_module.use(None)


@pytest.fixture
def runner(tmp_path: Path, conn: Any) -> Runner:
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, progress_interval=0,
                             heartbeat_interval=3600)
    return runner_module.use(Runner(config, conn))  # type: ignore[return-value]


def test_a_stopped_run_goes_back_on_its_queue_and_the_next_resumes_after_the_items_done(client, runner, conn):
    task_id = submit(client, "rs.counted", n=10)
    stop_at["item"] = 3
    assert runner.run(task_id) is None
    back = status(client, task_id)
    assert back["status"] == TaskStatus.PENDING and back["attempts"] == 0 and back["resumed"] == 0
    assert back["items"] == {"total": 10, "succeeded": 4, "failed": 0}
    assert "interrupted by a worker stop after 4 items" in back["message"]
    queued = Queue("default", connection=conn).get_job_ids()
    assert resume_job_id(task_id, 3) in queued or any(j.startswith(f"{task_id}_r") for j in queued)

    assert runner.run(task_id) == COMPLETED  # the resumed run ended the task: RQ files its job as finished
    done = status(client, task_id)
    assert done["status"] == TaskStatus.COMPLETED and done["attempts"] == 1 and done["resumed"] == 1
    assert done["items"] == {"total": 10, "succeeded": 10, "failed": 0}
    assert calls == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]  # every item once
    assert client.get(f"{API}/{task_id}/result").get_json()["result"]["sum"] == sum(n * 2 for n in range(10))
    assert not conn.exists(keys.checkpoint(task_id)) and not conn.exists(keys.cursor(task_id))  # dropped at the end


def test_a_processor_s_own_cursor_is_handed_to_the_next_run(client, runner):
    task_id = submit(client, "rs.cursor")
    stop_at["page"] = 1
    runner.run(task_id)
    assert status(client, task_id)["status"] == TaskStatus.PENDING
    runner.run(task_id)
    assert calls == [0, 1, 2, 3, 4]
    assert client.get(f"{API}/{task_id}/result").get_json()["result"] == {"from": 3}  # page 2 saved 3, then stopped


def test_a_cancel_during_a_stop_wins(client, runner, monkeypatch):
    task_id = submit(client, "rs.counted", n=5)
    stop_at["item"] = 1
    monkeypatch.setattr(runner_module, "interrupt_current",
                        lambda: (client.delete(f"{API}/{task_id}"), runner.interrupt()))
    runner.run(task_id)
    assert status(client, task_id)["status"] == TaskStatus.CANCELLED


def lost(store: Any, task_id: str) -> str | None:
    """Housekeeping's recovery of a run whose worker died (its heartbeat taken as stale)."""
    task = store.get(task_id)
    return store.recover(task, now_ms() + 60_000)


def test_a_lost_run_whose_checkpoint_advanced_resumes_for_free_then_fails_when_it_stops_advancing(
        client, runner):
    task_id = submit(client, "rs.counted", n=10)
    store = runner.store
    started = store.start(task_id, "run-1").started
    assert started is not None and started.task.attempts == 1
    store.report(task_id, "run-1", 30, "item 3", {"total": 10, "succeeded": 3, "failed": 0},
                 checkpoint=b'{"c":[10,3,0],"e":null,"r":[[0,10,3,0]]}')
    assert lost(store, task_id) == TaskStatus.PENDING  # advanced: no attempt used
    again = status(client, task_id)
    assert again["attempts"] == 0 and "resuming from its checkpoint" in again["message"]

    for n in range(1, store.config.lost_runs + 1):  # dies at once, before any checkpoint: run again, for free
        assert store.start(task_id, f"run-{n + 1}").started is not None
        assert lost(store, task_id) == TaskStatus.PENDING
        assert status(client, task_id)["attempts"] == 0
    assert store.start(task_id, "run-last").started is not None
    assert lost(store, task_id) == TaskStatus.FAILED  # past the bound of lost runs without progress
    failed = status(client, task_id)
    assert failed["error"]["code"] == ErrorCode.WORKER_LOST
    assert "at item 4 of 10" in failed["error"]["message"]


def test_the_transition_keeps_the_resume_mark(client, runner):
    task_id = submit(client, "rs.counted", n=3)
    store = runner.store
    store.start(task_id, "run-1")
    store.report(task_id, "run-1", 10, "", None, cursor=b"1")
    task = store.get(task_id)
    assert task.checkpoints == 1 and task.resumable
    store.recover(task, now_ms() + 60_000)
    assert not dataclasses.replace(store.get(task_id)).resumable


def test_a_run_that_reaches_no_cancellation_point_within_the_grace_is_put_back_and_its_process_ends(
        client, conn, tmp_path, monkeypatch, caplog):
    from workers import heartbeat

    ended = threading.Event()
    monkeypatch.setattr(heartbeat.os, "_exit", lambda code: ended.set())  # the process would end here

    def stubborn(payload: dict, ctx: TaskContext) -> dict:
        runner_module.interrupt_current()
        ended.wait(10)  # busy without a cancellation point until the grace ran out
        return {"never": "stored"}

    processors.processor("rs.stubborn", schema=AnyPayload, timeout=30)(stubborn)
    config = Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, progress_interval=0,
                             heartbeat_interval=3600, stop_grace=0.2)
    runner = runner_module.use(Runner(config, conn))
    assert runner is not None
    task_id = submit(client, "rs.stubborn")
    with caplog.at_level(logging.INFO, logger="workers.runner"):
        runner.run(task_id)
    assert ended.is_set()
    assert any("did not reach a cancellation point within the 0.2 s stop grace: put back" in r.getMessage()
               for r in caplog.records)  # one line, with the task id
    back = status(client, task_id)
    assert back["status"] == TaskStatus.PENDING and back["attempts"] == 0  # put back, no attempt used
    assert "interrupted by a worker stop" in back["message"]
