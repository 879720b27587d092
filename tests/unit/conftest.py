"""Unit fixtures: fakeredis with Lua, a Config with short windows, the store, a Flask test client (of the
module's ``config``, so a module overriding ``config`` gets its app), and ``report``: a Recorder for a
TaskContext."""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest

from app import create_app
from app.config import Config
from app.store import TaskStore
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
def app(config, conn):
    return create_app(config, conn=conn)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def report() -> Recorder:
    return Recorder()
