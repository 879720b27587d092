"""Shared test setup. Unit fixtures live in tests/unit/conftest.py, real-process ones in
tests/integration/conftest.py (harness in tests/integration/harness.py).

``s3_server``: one real S3-compatible server (moto's standalone server, tests/s3server.py) on
loopback for the whole run; each test makes its own bucket. For every suite (unit, integration,
browser, fuzz): a failing test's report carries the log tail of each process of its ``stack`` and
of each ``taskport up`` run of its ``up_factory``, and a session-end sweep kills whatever the harness
launched and a test left behind."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from tests.integration.harness import Stack, reap_all
from tests.s3server import S3Server, running_s3


def _fakeredis_reads_a_scripts_shebang() -> None:
    """fakeredis 2.41 compiles a script as it is, so the ``#!lua`` line that Redis 7+ and Valkey read as a
    script's declaration (app.core.lua.SHEBANG) is a Lua syntax error there: it runs the script without that
    line (the rest of the script, and its digest, unchanged)."""
    from fakeredis.commands_mixins.scripting_mixin import ScriptingCommandsMixin

    original = ScriptingCommandsMixin.eval

    @functools.wraps(original)
    def eval(self: Any, script: bytes, numkeys: int, *keys_and_args: bytes) -> Any:
        if script.startswith(b"#!"):
            script = script[script.index(b"\n"):]
        return original(self, script, numkeys, *keys_and_args)

    ScriptingCommandsMixin.eval = eval  # type: ignore[method-assign]


_fakeredis_reads_a_scripts_shebang()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with running_s3() as server:
        yield server


@pytest.fixture(autouse=True)
def _web_retry_policy() -> Iterator[None]:
    """Every test starts with the web's fail-fast Redis policy: a test that runs a worker's or the
    scheduler's setup in this process (which switches the process to riding outages out) must not
    leave later tests waiting a minute for a Redis that is down on purpose."""
    from app.core import connection

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


@pytest.fixture(scope="session", autouse=True)
def _no_orphans() -> Iterator[None]:
    yield
    reap_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.when == "call" and report.failed:
        funcargs = getattr(item, "funcargs", {})
        stack = funcargs.get("stack")
        if isinstance(stack, Stack):
            report.sections.append(("stack process logs", stack.log_tails()))
        for up in getattr(funcargs.get("up_factory"), "runs", []):
            report.sections.append((f"taskport up log ({up.log_path})", up.tail()))
    return report
