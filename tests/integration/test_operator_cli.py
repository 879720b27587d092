"""The ``taskport`` command as operators and users run it, a real process each time: ``config`` prints what is in
effect (and fails on a bad value as every process does), the global options work before the command too,
``audit`` finds the embedded Redis from the data dir, and ``pause``/``resume`` drive the operator API."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from app.core.config import without_settings
from tests.integration.harness import REPO_ROOT, Api, RedisServer, Stack

PASSWORD = "op-secret"


def taskport(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """``taskport ARGS`` (python -m app.launch.cli) with only ``env`` of taskport's settings set."""
    return subprocess.run([sys.executable, "-m", "app.launch.cli", *args], cwd=REPO_ROOT, input=stdin,
                          capture_output=True, text=True, timeout=60,
                          env={**without_settings(os.environ), "TASKPORT_URL": "", "TASKPORT_API_KEY": "", **env})


def settings(out: str) -> dict[str, tuple[str, str]]:
    """``taskport config``'s lines: variable -> (value, where it came from)."""
    rows = {}
    for line in out.splitlines():
        env, *middle, source = line.split()
        rows[env] = (" ".join(middle), source)
    return rows


def test_config_prints_what_is_in_effect_and_where_it_came_from_with_secrets_masked(tmp_path: Path) -> None:
    done = taskport("config", PORT="8271", REDIS_URL="redis://:hunter2@db.example:6380/0",
                    TASKPORT_DASHBOARD_PASSWORD="hunter2", TASKPORT_DATA_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    rows = settings(done.stdout)
    assert rows["PORT"] == ("8271", "environment")
    assert rows["WEB_CONCURRENCY"] == ("2", "default")
    assert rows["TASKPORT_DATA_DIR"] == (str(tmp_path), "environment")
    assert rows["REDIS_URL"] == ("redis://:********@db.example:6380/0", "environment")
    assert rows["TASKPORT_DASHBOARD_PASSWORD"] == ("******** (set)", "environment")
    assert rows["TASKPORT_API_KEYS"] == ("(unset)", "default")
    assert "hunter2" not in done.stdout + done.stderr


@pytest.mark.parametrize("env, message", [
    ({"PORT": "eighty"}, "taskport: error: PORT must be an integer, got 'eighty'"),
    ({"TASKPORT_WORKER_CLASS": "threads"}, "taskport: error: TASKPORT_WORKER_CLASS must be fork, simple or spawn, got "
                                           "'threads'"),
])
def test_config_fails_on_a_bad_value_as_every_process_does(env: dict[str, str], message: str) -> None:
    done = taskport("config", **env)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (2, "", message)
    web = taskport("web", **env)  # what the process itself says
    assert (web.returncode, web.stderr.strip()) == (2, message)


def test_config_defaults_is_the_table_of_docs_configuration(tmp_path: Path) -> None:
    done = taskport("config", "--defaults", PORT="8271")
    assert done.returncode == 0 and done.stdout.splitlines()[0] == "| Variable | Default | Meaning |"
    assert "| `PORT` | `8000` |" in done.stdout  # the defaults, whatever the environment says


@pytest.mark.parametrize("where", ["before", "after"])
def test_url_and_api_key_work_before_the_command_as_after_it(stack: Stack, where: str) -> None:
    stack.configure(api_keys="k-alice:alice")
    stack.start_web()
    with Api(stack.base_url, key="k-alice") as api:
        task_id = api.create("demo.sleep", {}, dedup_key=uuid.uuid4().hex)  # no worker: it stays PENDING
    options = ["--url", stack.base_url, "--api-key", "k-alice"]
    args = [*options, "status", task_id] if where == "before" else ["status", task_id, *options]
    for command in ([sys.executable, "-m", "app.launch.cli"], [sys.executable, "-m", "taskport"]):
        done = subprocess.run([*command, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                              env={**without_settings(os.environ), "TASKPORT_URL": "", "TASKPORT_API_KEY": ""})
        assert done.returncode == 7, done.stdout + done.stderr  # still running: the service answered, key accepted
        assert task_id in done.stdout and "PENDING" in done.stdout


def test_max_attempts_says_what_an_attempt_is() -> None:
    done = taskport("watch", "--help")
    assert "status reads or event-stream connections" in " ".join(done.stdout.split())
    assert "one stream may follow a task to its end" in " ".join(done.stdout.split())


def test_audit_finds_the_embedded_redis_from_the_data_dir(stack: Stack, redis_server: RedisServer,
                                                          tmp_path: Path) -> None:
    stack.start_web()
    with Api(stack.base_url) as api:
        task_id = api.create("demo.sleep", {}, dedup_key=uuid.uuid4().hex)
    done = taskport("audit", "--task", task_id, TASKPORT_DATA_DIR=str(redis_server.config.data_dir))
    assert done.returncode == 0, done.stderr
    assert task_id in done.stdout and "-> PENDING" in done.stdout
    nothing = taskport("audit", TASKPORT_DATA_DIR=str(tmp_path / "var"))
    assert nothing.returncode == 1 and nothing.stdout == ""
    assert nothing.stderr.startswith(f"taskport: error: no embedded Redis runs in {tmp_path / 'var' / 'redis'}")
    assert len(nothing.stderr.splitlines()) == 1


def test_pause_and_resume_drive_the_operator_api(stack: Stack) -> None:
    stack.configure(dashboard_password=PASSWORD)
    stack.start_web()
    url = ["--url", stack.base_url]
    done = taskport("pause", "default", "--password-stdin", *url, stdin=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("paused default: no worker takes its jobs until `taskport resume default`")
    assert requests.get(stack.url("/readyz"), timeout=5).json()["paused_queues"] == ["default"]
    wrong = taskport("pause", "low", "--password-stdin", *url, stdin="wrong\n")
    assert wrong.returncode == 1 and wrong.stderr.startswith("taskport: error: 401 Operator credentials required")
    asked = taskport("pause", "low", *url)  # no terminal to ask on, no --password-stdin
    assert asked.returncode == 2 and "--password-stdin" in asked.stderr
    unknown = taskport("pause", "bulk", "--password-stdin", *url, stdin=PASSWORD)
    assert unknown.returncode == 2 and "invalid choice: 'bulk'" in unknown.stderr
    done = taskport("resume", "default", "--password-stdin", "--json", *url, stdin=PASSWORD)
    assert done.returncode == 0 and '"paused_queues": []' in done.stdout
    assert requests.get(stack.url("/readyz"), timeout=5).json()["paused_queues"] == []


# minutes of real processes and timeouts: `make test-slow` (CI runs it), which keeps `make test` within its budget
pytestmark = pytest.mark.slow
