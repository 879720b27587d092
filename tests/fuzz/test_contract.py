"""The API fuzzed against its own OpenAPI document (``make test-fuzz``): schemathesis, every operation, every
check, the stateful links the document declares (a task: submit -> status, result, events, cancel -> run again; a
result -> its file; a batch -> its documents and tasks; a schedule -> read, change, delete), against the live
stack: a real redis-server, a real RQ worker and gunicorn with its gevent workers, once with API keys (the fuzzer
also sends requests without one: its ignored_auth check) and once in open mode.

One worker thread: with two, hypothesis' ast.parse of a lambda's source in both threads at once hit CPython
3.11's "AST constructor recursion depth mismatch" SystemError (a race in the interpreter, gh-106905) once.

Every check runs: schemathesis enables all of them unless told otherwise (only max_response_time, a time limit,
is opt-in), and the run names none on its command line, since ``--checks`` there would override the config file
per operation too (its CLI values go to the highest-priority project config, config/_projects.py:686-722).
schemathesis.toml says, with the schemathesis source lines, where the contract makes a check's assumption
untrue: use_after_free takes every successful DELETE for a removal and fails any 2xx read below it anywhere in the
same scenario tree (specs/openapi/checks.py:1417-1480), while DELETE /tasks/{id} and /batches/{id} cancel, and
the task or batch stays readable (CANCELLED) and may run again by contract; so it is off for those reads only
(:func:`test_every_check_runs_but_use_after_free_on_what_a_cancel_leaves_readable` keeps it so), and judges
DELETE /schedules/{id}, a true delete. Link inference is off because the document declares every link (it would
guess submit -> /result/file, which a task without a file answers 404 by contract). Everything else that fails is
a finding to fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from schemathesis.checks import CHECKS
from schemathesis.config import SchemathesisConfig
from schemathesis.core.result import Ok

from app.web.api import docs
from tests.integration.harness import RedisServer, Stack, wait_until

# Wall-clock budget of one schemathesis run (it repeats fuzzing and stateful tests until it is spent).
MAX_TIME = int(os.environ.get("TASKPORT_FUZZ_SECONDS", "40"))
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CONFIG = Path(__file__).with_name("schemathesis.toml")
CANCELS = ("cancelTask", "cancelBatch")  # the DELETEs that cancel: what they target stays readable
OPT_IN = {"max_response_time"}  # a time limit, not a property of the contract


def test_every_check_runs_but_use_after_free_on_what_a_cancel_leaves_readable() -> None:
    """The config file turns off nothing but use_after_free, and that only on the reads below a cancel."""
    schema = schemathesis.openapi.from_dict(docs.build_spec(True).to_dict(),
                                            config=SchemathesisConfig.from_path(str(CONFIG)))
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results)
    cancels = [op.path for op in operations if op.definition.raw.get("operationId") in CANCELS]
    assert len(cancels) == len(CANCELS)
    below_a_cancel = {op.definition.raw["operationId"] for op in operations
                      if op.method == "get" and any(op.path.startswith(path) for path in cancels)}
    assert {"getTask", "getResultFile", "getBatchEvents"} <= below_a_cancel
    assert schema.config.phases.stateful.enabled
    for op in operations:
        for phase in ("examples", "coverage", "fuzzing", "stateful"):
            checks = schema.config.checks_config_for(operation=op, phase=phase)
            off = {name for name in CHECKS.get_all_names() if not checks.get_by_name(name=name).enabled}
            expected = {"use_after_free"} if op.definition.raw.get("operationId") in below_a_cancel else set()
            assert off - OPT_IN == expected, (op.label, phase)


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
                   "--max-time", str(MAX_TIME),
                   "--workers", "1", "--suppress-health-check", "too_slow", "--request-timeout", "10"]
        if keys:
            command += ["--header", "Authorization: Bearer kf"]
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=MAX_TIME * 3 + 60)
        report = done.stdout[-20000:] + done.stderr[-5000:]
        assert done.returncode == 0, f"schemathesis found problems:\n{report}\n{stack.log_tails(20)}"
    finally:
        stack.teardown()
