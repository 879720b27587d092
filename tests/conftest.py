"""Shared test setup. Unit fixtures live in tests/unit/conftest.py, real-process ones in
tests/integration/conftest.py (harness in tests/integration/harness.py).

``s3_server``: one real S3-compatible server (moto's standalone server, tests/s3server.py) on
loopback for the whole run; each test makes its own bucket."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.s3server import S3Server, running_s3


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with running_s3() as server:
        yield server


@pytest.fixture(autouse=True)
def _web_retry_policy() -> Iterator[None]:
    """Every test starts with the web's fail-fast Redis policy: a test that runs a worker's or the
    scheduler's setup in this process (which switches the process to riding outages out) must not
    leave later tests waiting a minute for a Redis that is down on purpose."""
    from app import connection

    yield
    connection._ride_out = False


def pytest_make_parametrize_id(config: pytest.Config, val: object, argname: str) -> str | None:
    """A fresh uuid4 as a parameter gets a stable test id ("uuid", "UUID" in capitals), so that every
    pytest-xdist worker collects the same tests; other values keep pytest's own ids."""
    if not isinstance(val, str):
        return None
    try:
        uuid.UUID(val)
    except ValueError:
        return None
    return "uuid" if val == val.lower() else "UUID"
