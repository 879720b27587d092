"""Unit fixtures: fakeredis with Lua, a Config with short windows, the store, ``enqueue`` (an RQ job
alone), a Flask test client (of the module's ``config``, so a module overriding ``config`` gets its app),
and ``report``: a Recorder for a TaskContext."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import fakeredis
import pytest

from app.core.config import Config
from app.core.jobs import JobQueue
from app.core.store import TaskStore
from app.web import create_app
from tests.unit.recorder import Recorder


@pytest.fixture
def config(tmp_path) -> Config:
    return Config.from_env({}, redis_url="redis://fake", data_dir=tmp_path)


@pytest.fixture
def conn() -> Iterator[fakeredis.FakeRedis]:
    server = fakeredis.FakeServer()
    client = fakeredis.FakeRedis(server=server)
    yield client
    client.close()


@pytest.fixture
def store(conn, config) -> TaskStore:
    return TaskStore(conn, config)


@pytest.fixture
def enqueue(conn, config) -> Callable[[str, str, int], None]:
    """Queue the RQ job of a task id with no task record (``enqueue(task_id, priority, timeout)``): the
    commands a submit would replay (JobQueue.job_commands), sent in one transaction."""
    jobs = JobQueue(conn, config)

    def queue_job(task_id: str, priority: str, timeout: int) -> None:
        with conn.pipeline() as pipe:
            for command in jobs.job_commands(task_id, priority, timeout):
                pipe.execute_command(command.name, command.key, *command.args)
            pipe.execute()

    return queue_job


@pytest.fixture
def app(config, conn):
    return create_app(config, conn=conn)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def report() -> Recorder:
    return Recorder()
