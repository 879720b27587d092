"""The runner (workers/runner.py) through its public seams, on fakeredis: a task is submitted over HTTP,
one delivery runs with ``Runner.run`` (or RQ's entry point ``run_task`` on the Runner installed with
``runner.use``), and what the client sees is read back over HTTP.

What one delivery does: start the task (a second delivery does nothing), report progress, complete
with the output, fail with the processor's code or the service's (-1, -2), record failed items,
stop without writing once the task was cancelled, and wait out a retry's backoff in keys.DELAYED while attempts
remain. What it
returns to RQ says how the delivery ended the task (a RunEnd the worker files in RQ's registries), or that it
changed no end (None).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from marshmallow import INCLUDE, Schema
from rq.timeouts import JobTimeoutException

from app.core import deferred, keys, processors
from app.core.clock import iso, now_ms
from app.core.config import Config
from app.core.jobs import retry_job_id
from app.core.states import ERROR_MESSAGES, ErrorCode, TaskStatus
from app.web import create_app
from workers import runner as runner_module
from workers.context import TaskContext
from workers.endings import COMPLETED, RunEnd
from workers.exceptions import ItemError, TaskError
from workers.runner import Runner

API = "/api/v1/tasks"
# what a processor below calls at its first step (set per test): look at the task, cancel it...
hooks: dict[str, Callable[[str], None]] = {}


class AnyPayload(Schema):
    class Meta:
        unknown = INCLUDE


def echo(payload: dict, ctx: TaskContext) -> dict:
    ctx.progress(40, message="half way there")
    hooks.get("step", lambda task_id: None)(ctx.task_id)
    return {"echo": payload["text"]}


def refuse(payload: dict, ctx: TaskContext) -> dict:
    raise TaskError(payload["code"], "refused on purpose")


def some_items_fail(payload: dict, ctx: TaskContext) -> dict:
    def one(n: int) -> int:
        if n % 2:
            raise ItemError(20002, f"odd item {n}")
        return n

    return {"kept": ctx.each(range(4), one, key=lambda n: f"item-{n}")}


def flaky(payload: dict, ctx: TaskContext) -> dict:
    raise RuntimeError("an unexpected failure")


def times_out(payload: dict, ctx: TaskContext) -> dict:
    raise JobTimeoutException("RQ's job timeout")


def writes_then_checkpoints(payload: dict, ctx: TaskContext) -> dict:
    with ctx.results.writer(ctx.task_id, "partial.csv") as fh:
        fh.write(b"a,b\n")
    hooks["step"](ctx.task_id)
    ctx.sleep(0.01)  # a checkpoint: raises TaskCancelled once the task is known to be cancelled
    ctx.progress(50)
    return {"never": "stored"}


PROCESSORS: dict[str, tuple[Callable[[dict, TaskContext], dict], int]] = {
    "rt.echo": (echo, 0), "rt.refuse": (refuse, 0), "rt.items": (some_items_fail, 0), "rt.flaky": (flaky, 1),
    "rt.timeout": (times_out, 0), "rt.cancelled": (writes_then_checkpoints, 0),
}


def registering(monkeypatch: pytest.MonkeyPatch, table: dict[str, tuple[Callable[[dict, TaskContext], dict], int]],
                ) -> Iterator[None]:
    """The processors of ``table`` (type -> (function, retries)), in a private copy of the registry; no hook and
    no installed Runner after (tests/unit/test_fence.py's too)."""
    processors.load()
    monkeypatch.setattr(processors, "_REGISTRY", dict(processors._REGISTRY))
    for task_type, (func, retries) in table.items():
        processors.processor(task_type, schema=AnyPayload, timeout=30, retries=retries)(func)
    yield
    hooks.clear()
    runner_module.use(None)


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The processors above."""
    yield from registering(monkeypatch, PROCESSORS)


@pytest.fixture
def config(tmp_path: Path) -> Config:
    # every progress call writes; the heartbeat stays quiet (the processors here checkpoint themselves)
    return Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path, progress_interval=0,
                           heartbeat_interval=3600, retry_backoff="4,9")


@pytest.fixture
def runner(config: Config, conn: Any) -> Runner:
    return Runner(config, conn)


def submit(client: Any, task_type: str, **payload: Any) -> str:
    r = client.post(API, json={"type": task_type, "payload": payload})
    assert r.status_code == 202, r.get_json()
    return str(r.get_json()["task_id"])


def status(client: Any, task_id: str) -> dict[str, Any]:
    return dict(client.get(f"{API}/{task_id}").get_json())


def test_a_delivery_starts_the_task_reports_progress_and_completes_with_the_output(client, runner):
    task_id = submit(client, "rt.echo", text="hi")
    seen: list[dict[str, Any]] = []
    hooks["step"] = lambda tid: seen.append(status(client, tid))
    assert runner.run(task_id) == COMPLETED  # the worker files the job as finished
    assert seen[0]["status"] == TaskStatus.PROCESSING and seen[0]["attempts"] == 1
    assert (seen[0]["progress"], seen[0]["message"]) == (40, "half way there")
    done = status(client, task_id)
    assert done["status"] == TaskStatus.COMPLETED and done["progress"] == 100 and done["error"] is None
    assert client.get(f"{API}/{task_id}/result").get_json()["result"] == {"echo": "hi"}


def test_a_second_delivery_of_a_started_task_does_nothing(client, runner):
    task_id = submit(client, "rt.echo", text="once")
    calls: list[str] = []
    hooks["step"] = calls.append
    runner.run(task_id)
    before = status(client, task_id)
    assert runner.run(task_id) is None  # it ended nothing: RQ deletes the job
    assert calls == [task_id] and status(client, task_id) == before


def test_a_task_error_fails_the_task_with_its_code_and_is_never_retried(client, runner):
    task_id = submit(client, "rt.refuse", code=10001)
    end = runner.run(task_id)
    assert end == RunEnd(TaskStatus.FAILED, 10001, "refused on purpose")
    assert end is not None and end.describe() == "task FAILED with code 10001: refused on purpose"  # RQ's exc_string
    doc = status(client, task_id)
    assert doc["status"] == TaskStatus.FAILED and doc["attempts"] == 1
    assert doc["error"] == {"code": 10001, "message": "refused on purpose"}


def test_failed_items_are_recorded_and_the_task_completes_with_the_rest(client, runner):
    task_id = submit(client, "rt.items")
    runner.run(task_id)
    body = client.get(f"{API}/{task_id}/result").get_json()
    assert body["result"] == {"kept": [0, 2]} and body["items"] == {"total": 4, "succeeded": 2, "failed": 2}
    assert body["failures"] == [{"item": "item-1", "code": 20002, "message": "odd item 1"},
                                {"item": "item-3", "code": 20002, "message": "odd item 3"}]
    assert body["error_code"] == 20002


def test_a_job_timeout_fails_the_task_with_minus_2(client, runner):
    task_id = submit(client, "rt.timeout")
    assert runner.run(task_id) == RunEnd(TaskStatus.FAILED, ErrorCode.TIMEOUT, ERROR_MESSAGES[ErrorCode.TIMEOUT])
    assert status(client, task_id)["error"] == {"code": ErrorCode.TIMEOUT,
                                                "message": ERROR_MESSAGES[ErrorCode.TIMEOUT]}


def test_an_unexpected_exception_is_retried_after_the_backoff_then_fails_with_minus_1(client, runner, conn):
    task_id = submit(client, "rt.flaky")  # retries=1: two attempts
    conn.lpop("rq:queue:default")  # RQ took the first job
    failed_at = now_ms()
    assert runner.run(task_id) is None  # RQ deletes the failed delivery's job: nothing of RQ's waits for the retry
    doc = status(client, task_id)
    assert doc["status"] == TaskStatus.PENDING and doc["attempts"] == 1 and doc["error"] is None
    assert doc["message"] == "attempt 1 failed; retrying in 4s"
    due = conn.zscore(keys.DELAYED, task_id)  # the backoff waits in taskport's delayed set, the first step's 4 s
    assert due is not None and failed_at + 4000 <= due <= now_ms() + 4000
    assert doc["run_at"] == iso(int(due))
    assert deferred.promote_due(runner.store, runner.jobs, int(due) - 1) == (0, 0)  # not before its time
    assert deferred.promote_due(runner.store, runner.jobs, int(due)) == (1, 1)
    assert conn.lrange("rq:queue:default", 0, -1) == [retry_job_id(task_id, 1).encode()]  # not the failed job's id
    assert runner.run(task_id) == RunEnd(TaskStatus.FAILED, ErrorCode.INTERNAL,  # the last attempt: no traceback
                                         ERROR_MESSAGES[ErrorCode.INTERNAL])
    doc = status(client, task_id)
    assert doc["status"] == TaskStatus.FAILED and doc["attempts"] == 2
    assert doc["error"] == {"code": ErrorCode.INTERNAL, "message": ERROR_MESSAGES[ErrorCode.INTERNAL]}


def files(config: Config) -> list[str]:
    return sorted(p.name for p in config.results_dir.rglob("*") if p.is_file())


def test_a_cancelled_task_stops_at_its_next_checkpoint_and_its_files_go(client, runner, config):
    task_id = submit(client, "rt.cancelled")
    written: list[list[str]] = []
    hooks["step"] = lambda tid: (written.append(files(config)), client.delete(f"{API}/{tid}"))
    assert runner.run(task_id) is None
    assert written == [["partial.csv"]] and files(config) == []
    doc = status(client, task_id)
    assert doc["status"] == TaskStatus.CANCELLED and doc["progress"] == 0  # the stopped run wrote nothing more


def test_run_task_runs_on_the_runner_installed_with_use(client, runner, monkeypatch):
    assert runner_module.use(runner) is runner
    task_id = submit(client, "rt.echo", text="via RQ's entry point")
    assert runner_module.run_task(task_id) == COMPLETED
    assert client.get(f"{API}/{task_id}/result").get_json()["result"] == {"echo": "via RQ's entry point"}
    runner_module.use(None)  # forgotten: the next delivery builds a Runner from the environment
    built: list[Config] = []
    monkeypatch.setattr(runner_module, "prepare", lambda config: built.append(config) or runner)
    runner_module.run_task(submit(client, "rt.echo", text="again"))
    assert len(built) == 1


def test_stop_current_abandons_the_run_in_progress(client, runner, config):
    runner_module.use(runner)
    task_id = submit(client, "rt.cancelled")
    hooks["step"] = lambda tid: runner_module.stop_current(tid)  # RQ's stop-job command, simple worker
    assert runner.run(task_id) is None  # stopped at the checkpoint right after, its files removed
    assert files(config) == [] and status(client, task_id)["status"] == TaskStatus.PROCESSING  # no write


@pytest.fixture
def client(config: Config, conn: Any) -> Any:
    return create_app(config, conn=conn).test_client()
