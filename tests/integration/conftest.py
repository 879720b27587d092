"""Integration fixtures: a real redis-server, real processes (see harness.py).

- ``redis_server``: one embedded redis-server per test module (starting one takes ~0.1 s); a test may
  stop, kill or restart it: the next ``redis_conn`` brings it back.
- ``redis_conn``: a client of ``redis_server``, which it empties first (FLUSHALL).
- ``redis_factory``: ``redis_factory(fsync="always")`` starts a private server in a new dir
  (``executable=redis_proper()``: Redis itself instead of the embedded valkey-server).
- ``stack``: a Stack against ``redis_server`` (emptied first); every process stops at teardown.
- ``api``: an Api on ``stack``'s web, started with the module's ``stack_settings`` (Config fields; none
  unless a module overrides that fixture).
- ``up_factory``: ``up_factory(**env)`` starts a ``taskport up`` run in the test's tmp dir; every run is
  killed after the test, whatever happened.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.integration.harness import Api, RedisServer, Stack, Up


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.close()


@pytest.fixture
def redis_conn(redis_server: RedisServer) -> Iterator[redis.Redis]:
    if not redis_server.running:
        redis_server.start()
    conn = redis_server.client()
    conn.flushall()
    yield conn
    conn.close()


@pytest.fixture
def redis_factory(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    servers: list[RedisServer] = []

    def make(fsync: str = "everysec", directory: Path | None = None, executable: str | None = None) -> RedisServer:
        server = RedisServer(directory or tmp_path / f"redis-{len(servers) + 1}", fsync=fsync,
                             executable=executable).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def stack(redis_server: RedisServer, redis_conn: redis.Redis, tmp_path: Path) -> Iterator[Stack]:
    s = Stack(redis_server.url, tmp_path / "stack")
    yield s
    s.teardown()


@pytest.fixture
def stack_settings() -> dict[str, Any]:
    return {}


@pytest.fixture
def api(stack: Stack, stack_settings: dict[str, Any]) -> Iterator[Api]:
    stack.configure(**stack_settings)
    stack.start_web()
    with Api(stack.base_url) as client:
        yield client


@pytest.fixture
def up_factory(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    runs: list[Up] = []

    def start(**env: str) -> Up:
        workdir = tmp_path / f"up-{len(runs) + 1}"
        workdir.mkdir()
        runs.append(Up(workdir, **env))
        return runs[-1]

    start.runs = runs  # type: ignore[attr-defined]  # for the failure report (tests/conftest.py)
    yield start
    for run in runs:
        run.kill_everything()
