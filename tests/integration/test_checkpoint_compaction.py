"""Issue 29 finding 4 on real Valkey: a task of 120 items, stopped half-way and resumed, completes with 120
results, while the heartbeat's flush writes checkpoints (through the real progress script: APPEND, and SET
for the line that replaces the log) at every point of the item runs.

The real runner and an RQ worker run in this process (as test_worker_bookkeeping.py does), so the second
thread's flush can be placed deterministically: a trace hook stops the worker's thread at every line of
workers/items.py and has another thread flush the run's context there, the way the heartbeat thread may at
any moment. Before the fix, a compaction caught between a fold's counts and its results dropped results for
good: the resumed run handed back fewer results than its counts said.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType

import pytest
import redis
from flask.testing import FlaskClient
from marshmallow import Schema

from app.core.config import Config
from app.core.states import QUEUES
from tests.integration.harness import RedisServer
from tests.integration.in_process import in_process_client  # noqa: F401 - fixtures
from tests.unit.test_checkpoint_interleaving import flushing_at_every_line
from workers.checkpoint import COMPACT_EVERY
from workers.context import TaskContext
from workers.processors import processor
from workers.worker import StoppableSimpleWorker

N = 120
STOPPED: set[str] = set()  # the tasks whose first run was stopped half-way


@processor("test.fold", schema=Schema, timeout=120)
def fold(payload: dict, ctx: TaskContext) -> dict:
    def item(i: int) -> int:
        if i == N // 2 and ctx.task_id not in STOPPED:
            STOPPED.add(ctx.task_id)
            ctx.mark_interrupted()  # what a SIGTERM to the worker does: the run is put back from its checkpoint
        return i

    return {"results": ctx.each(range(N), item)}


@pytest.fixture
def config(redis_server: RedisServer, redis_conn: redis.Redis, tmp_path: Path) -> Config:
    # a progress write per fold: the log reaches COMPACT_EVERY lines, and is replaced, more than once a run
    return Config.from_env({}, redis_url=redis_server.url, data_dir=tmp_path, api_keys="", progress_interval=0)


def items_context(frame: FrameType) -> TaskContext | None:
    """The context of the item run whose method ``frame`` is, if it is one."""
    ctx = getattr(frame.f_locals.get("self"), "ctx", None)
    return ctx if isinstance(ctx, TaskContext) else None


def burst(conn: redis.Redis) -> None:
    worker = StoppableSimpleWorker(list(QUEUES), connection=conn)
    sys.settrace(flushing_at_every_line(items_context))
    try:
        worker.work(burst=True, logging_level="WARNING")
    finally:
        sys.settrace(None)


def test_a_task_stopped_half_way_and_resumed_returns_every_result(client: FlaskClient, redis_conn: redis.Redis):
    assert N > 2 * COMPACT_EVERY
    r = client.post("/api/v1/tasks", json={"type": "test.fold", "payload": {}})
    assert r.status_code == 202, r.get_json()
    task_id = r.get_json()["task_id"]
    burst(redis_conn)  # the first run: stopped at item 60, put back on its queue; the second: resumed from 61
    answer = client.get(f"/api/v1/tasks/{task_id}/result")
    doc = answer.get_json()
    assert task_id in STOPPED and answer.status_code == 200 and doc["status"] == "COMPLETED", doc
    assert doc["items"] == {"total": N, "succeeded": N, "failed": 0}
    assert doc["result"]["results"] == list(range(N))  # finding 4: 119 of them, the counts saying 120
