"""Shared test setup. Unit fixtures live in tests/unit/conftest.py, real-process ones in
tests/integration/conftest.py (harness in tests/integration/harness.py).

``s3_server``: one real S3-compatible server (moto's standalone server, tests/s3server.py) on
loopback for the whole run; each test makes its own bucket."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.s3server import S3Server, running_s3


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with running_s3() as server:
        yield server
