"""bench/fill.py creates tasks the way a submit does, pipelined: its stand-in answer must read as the script's."""

from __future__ import annotations

import fakeredis
from rq.job import Job

from app.core import keys
from app.core.config import Config
from app.core.states import TaskStatus
from app.core.store import TaskStore
from bench.fill import create_tasks


def test_create_tasks_makes_pending_tasks_with_their_jobs_queued(conn: fakeredis.FakeRedis, config: Config) -> None:
    ids = create_tasks(conn, config, 5, enqueue=True, batch=2)
    assert len(set(ids)) == 5
    store = TaskStore(conn, config)
    for task_id in ids:
        task = store.get(task_id)
        assert task is not None and task.status == TaskStatus.PENDING
        assert conn.exists(keys.task(task_id)) and Job.exists(task_id, connection=conn)
