"""The API fuzzed against its own OpenAPI document (``make test-fuzz``): schemathesis, every operation,
every check, the stateful links of the document (submit -> status -> result -> cancel), against the live
stack: a real redis-server, a real RQ worker and gunicorn with its gevent workers, once with API keys (the
fuzzer also sends requests without one: its ignored_auth check) and once in open mode.

One worker thread: with two, hypothesis' ast.parse of a lambda's source in both threads at once hit CPython
3.11's "AST constructor recursion depth mismatch" SystemError (a race in the interpreter, gh-106905) once.
One check is left out: use_after_free assumes DELETE removes the resource, while here DELETE cancels a task
and the task stays readable (as CANCELLED) by contract. Everything else that fails is a finding to fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.integration.harness import RedisServer, Stack, wait_until

# Wall-clock budget of one schemathesis run (it repeats fuzzing and stateful tests until it is spent).
MAX_TIME = int(os.environ.get("TASKPORT_FUZZ_SECONDS", "40"))
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CONFIG = Path(__file__).with_name("schemathesis.toml")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.timeout(MAX_TIME * 3 + 120)
@pytest.mark.parametrize("keys", [True, False], ids=["api-keys", "open-mode"])
def test_every_answer_conforms_to_the_document(server: RedisServer, tmp_path: Path, keys: bool) -> None:
    # with keys, the operator routes are on too (the fuzzer's bearer key must get their 401)
    overrides = {"api_keys": "kf:fuzzer:high", "dashboard_password": "operator-secret"} if keys else {}
    stack = Stack(server.url, tmp_path / "stack", web_concurrency=2, housekeeping_interval=10, **overrides)
    try:
        stack.start_web()
        stack.start_worker()
        stack.start_scheduler()
        wait_until(lambda: requests.get(stack.url("/readyz"), timeout=2).status_code == 200, timeout=30,
                   message="the stack to be ready (a worker per queue, housekeeping has run)")
        command = [str(SCHEMATHESIS), "--config-file", str(CONFIG), "run", stack.url("/api/v1/openapi.json"),
                   "--checks", "all", "--exclude-checks", "use_after_free", "--max-time", str(MAX_TIME),
                   "--workers", "1", "--suppress-health-check", "too_slow", "--request-timeout", "10"]
        if keys:
            command += ["--header", "Authorization: Bearer kf"]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=MAX_TIME * 3 + 60)
        report = done.stdout[-20000:] + done.stderr[-5000:]
        assert done.returncode == 0, f"schemathesis found problems:\n{report}\n{stack.log_tails(20)}"
    finally:
        stack.teardown()
