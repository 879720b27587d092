"""Safe defaults with the real processes: a public bind without keys does not start; a running open-mode
web refuses a Host that is not its own (DNS rebinding)."""

from __future__ import annotations

import os
import subprocess
import sys

import requests

from app.core.config import without_settings
from tests.integration.harness import REPO_ROOT, Stack


def test_taskport_web_on_all_interfaces_without_keys_refuses_to_start_in_one_line() -> None:
    env = without_settings(os.environ)
    env.update(TASKPORT_HOST="0.0.0.0", PORT="1")
    done = subprocess.run([sys.executable, "-m", "app.launch.cli", "web"], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("taskport: error: TASKPORT_HOST=0.0.0.0"), done.stderr
    assert "TASKPORT_ALLOW_OPEN=1" in lines[0]


def test_open_mode_web_refuses_a_foreign_host_header(stack: Stack) -> None:
    stack.start_web()
    assert requests.get(stack.url("/healthz"), timeout=5).status_code == 200
    foreign = requests.get(stack.url("/api/v1/tasks"), headers={"Host": "rebound.example"}, timeout=5)
    assert foreign.status_code == 400
    assert foreign.headers["Content-Type"].startswith("application/problem+json")
    assert list(foreign.json()["errors"]) == ["Host"]
