"""Every known failure of a ``taskport`` command is one line on the terminal and a documented exit code
(docs/deploy.md), never a traceback. The commands run as real processes, all at once (the unreachable
Redis one waits the 30 s a process gives Redis to come up)."""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app.core.config import without_settings
from app.core.process import free_port
from app.launch.cli import EXIT_CONFIG, EXIT_FAILURE
from tests.integration.harness import REPO_ROOT

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults

WAIT_FOR_REDIS = 30  # app.core.connection.wait_for_redis's deadline


def run_all(cases: dict[str, tuple[list[str], dict[str, str]]]) -> dict[str, tuple[int, str]]:
    """Start every ``taskport`` command at once; returns name -> (exit code, stdout + stderr)."""
    base = without_settings(os.environ)
    procs = {
        name: subprocess.Popen([sys.executable, "-m", "app.launch.cli", *args], cwd=REPO_ROOT, env={**base, **env},
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, (args, env) in cases.items()
    }
    results = {}
    for name, proc in procs.items():
        out, _ = proc.communicate(timeout=WAIT_FOR_REDIS + 30)
        results[name] = (proc.returncode, out)
    return results


@pytest.mark.timeout(WAIT_FOR_REDIS + 60)
def test_known_failures_are_one_line_with_their_exit_code(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    (locked / "redis").mkdir(parents=True)
    with socket.socket() as busy, socket.socket() as closed, open(locked / "redis" / "owner.lock", "w") as lock:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused, and no other
        nobody = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"  # process can take the port meanwhile
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running `taskport up` holds it
        results = run_all({
            "worker without REDIS_URL": (["worker"], {}),
            "scheduler without REDIS_URL": (["scheduler"], {}),
            "web without REDIS_URL": (["web"], {"PORT": str(free_port())}),
            "Redis unreachable": (["worker"], {"REDIS_URL": nobody}),
            "port in use": (["web"], {"REDIS_URL": nobody, "PORT": str(busy.getsockname()[1])}),
            "data dir locked": (["up"], {"TASKPORT_DATA_DIR": str(locked), "PORT": str(free_port())}),
            "bad number": (["web"], {"PORT": "eighty"}),
            "bad level": (["worker"], {"TASKPORT_LOG_LEVEL": "LOUD", "REDIS_URL": nobody}),
        })
    expected = {
        "worker without REDIS_URL": (EXIT_CONFIG, "REDIS_URL is not set"),
        "scheduler without REDIS_URL": (EXIT_CONFIG, "REDIS_URL is not set"),
        "web without REDIS_URL": (EXIT_CONFIG, "REDIS_URL is not set"),
        "Redis unreachable": (EXIT_FAILURE, "Redis is unreachable"),
        "port in use": (EXIT_CONFIG, "is in use by another process"),
        "data dir locked": (EXIT_FAILURE, "is in use by another running taskport"),
        "bad number": (EXIT_CONFIG, "PORT must be an integer, got 'eighty'"),
        "bad level": (EXIT_CONFIG, "TASKPORT_LOG_LEVEL must be a level name"),
    }
    for name, (code, text) in expected.items():
        rc, out = results[name]
        lines = out.strip().splitlines()
        assert (rc, len(lines)) == (code, 1), f"{name}: exit {rc}, output:\n{out}"
        assert lines[0].startswith("taskport: error: ") and text in lines[0], f"{name}: {lines[0]}"
