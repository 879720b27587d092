"""Fixtures for a test that runs the web app and the real runner in its own process against the module's
redis-server (an RQ worker then runs in the test's thread): a module imports the ones it uses (named
``in_process_*``, so that a test's ``client`` argument is the fixture, not the import), and may override
``config``.

- ``config``: a Config on ``redis_server``, open mode, results in the test's tmp dir.
- ``client``: the web app's test client, with a ``Runner`` on ``config`` installed (``runner.use``) for the
  worker's deliveries, uninstalled after.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from flask.testing import FlaskClient

from app.core.config import Config
from app.web import create_app
from tests.integration.harness import RedisServer
from workers import runner


@pytest.fixture(name="config")
def in_process_config(redis_server: RedisServer, redis_conn: redis.Redis, tmp_path: Path) -> Config:
    return Config.from_env({}, redis_url=redis_server.url, data_dir=tmp_path, api_keys="")


@pytest.fixture(name="client")
def in_process_client(config: Config, redis_conn: redis.Redis) -> Iterator[FlaskClient]:
    runner.use(runner.Runner(config, redis_conn))
    yield create_app(config, conn=redis_conn).test_client()
    runner.use(None)
