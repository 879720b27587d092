"""The API fuzzed against its own OpenAPI document (``make test-fuzz``): schemathesis, every operation, every
check, the stateful links the document declares (a task: submit -> status, result, events, cancel -> run again; a
result -> its file; a batch -> its documents and tasks; a schedule -> read, change, delete), against the live
stack: a real redis-server, a real RQ worker and gunicorn with its gevent workers, once with API keys (the fuzzer
also sends requests without one: its ignored_auth check) and once in open mode.

One worker thread: with two, hypothesis' ast.parse of a lambda's source in both threads at once hit CPython
3.11's "AST constructor recursion depth mismatch" SystemError (a race in the interpreter, gh-106905) once.

The run is ``schemathesis run --checks all --phases examples,coverage,fuzzing,stateful``: every check, the four
phases. ``--checks`` on the command line overrides the config file per operation too (its CLI values go to the
highest-priority project config, config/_projects.py:686-722, and an explicit enable wins, config/_checks.py:288), so
schemathesis.toml only widens the statuses some checks accept, with the reason for each. The one failure that is not
the API's, use_after_free after a cancel (DELETE /tasks/{id} and /batches/{id} cancel: the task or batch stays
readable, CANCELLED, and may run again by contract), is dropped by tests/fuzz/hooks.py's filter_failure, and only
that (:func:`test_every_check_runs_and_only_a_read_after_a_cancel_is_forgiven`). Link inference is off because the
document declares every link (it would guess submit -> /result/file, which a task without a file answers 404 by
contract). Everything else that fails is a finding to fix.

The stacks have no TASKPORT_CALLBACK_SECRETS, so the document they serve offers no ``callback`` (a deployment's
document offers only what it accepts: app/web/api/docs_components.py, without_callbacks).
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
from schemathesis.openapi.checks import UseAfterFree

from app.web.api import docs
from tests.fuzz.hooks import is_cancel_read
from tests.integration.harness import RedisServer, Stack, wait_until

# Wall-clock budget of one schemathesis run (it repeats fuzzing and stateful tests until it is spent).
MAX_TIME = int(os.environ.get("TASKPORT_FUZZ_SECONDS", "40"))
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")
CONFIG = Path(__file__).with_name("schemathesis.toml")
OPT_IN = {"max_response_time"}  # a time limit, not a property of the contract
PHASES = "examples,coverage,fuzzing,stateful"
ROOT = Path(__file__).parents[2]


def test_every_check_runs_and_only_a_read_after_a_cancel_is_forgiven() -> None:
    """With ``--checks all`` (as the run passes it) every check is on for every operation in every phase, and the
    hook drops use_after_free's finding only when its DELETE was a cancel."""
    config = SchemathesisConfig.from_path(str(CONFIG))
    config.projects.override.checks.update(included_check_names=["all"])  # what the CLI's --checks all does
    schema = schemathesis.openapi.from_dict(docs.build_spec(True, callbacks=False).to_dict(), config=config)
    results = list(schema.get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results)
    assert schema.config.phases.stateful.enabled
    for op in operations:
        for phase in PHASES.split(","):
            checks = schema.config.checks_config_for(operation=op, phase=phase)
            off = {name for name in CHECKS.get_all_names() if not checks.get_by_name(name=name).enabled}
            assert off - OPT_IN == set(), (op.label, phase)

    def after(free: str) -> UseAfterFree:
        return UseAfterFree(operation="GET", message="", free=free, usage="GET /x")

    assert is_cancel_read(after("DELETE /api/v1/tasks/6f1c"))
    assert is_cancel_read(after("DELETE /api/v1/batches/6f1c"))
    assert not is_cancel_read(after("DELETE /api/v1/schedules/6f1c"))  # a true delete: judged
    assert not is_cancel_read(after("DELETE /api/v1/tasks/6f1c/tokens"))


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
                   "--checks", "all", "--phases", PHASES, "--max-time", str(MAX_TIME),
                   "--workers", "1", "--suppress-health-check", "too_slow", "--request-timeout", "10"]
        if keys:
            command += ["--header", "Authorization: Bearer kf"]
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.fuzz.hooks",
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=MAX_TIME * 3 + 60)
        report = done.stdout[-20000:] + done.stderr[-5000:]
        print(done.stdout[done.stdout.rfind("SUMMARY"):])  # the figures (cases, failures, dropped): pytest -s or -rP
        assert done.returncode == 0, f"schemathesis found problems:\n{report}\n{stack.log_tails(20)}"
    finally:
        stack.teardown()
