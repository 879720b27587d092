"""A ``TASKPORT_PROCESSORS`` module that does not import is one line and exit 2 from every command that runs tasks'
code, before anything starts: ``taskport up`` starts no supervisor (which restarted each process, a traceback a
time, until it gave up), and a role never waits for Redis first. Real processes, all at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from app.core.config import without_settings
from app.core.process import free_port
from app.launch.cli import EXIT_CONFIG
from tests.integration.harness import REPO_ROOT

LINE = ("taskport: error: TASKPORT_PROCESSORS: cannot load processor module 'no_such_procs_xyz': "
        "No module named 'no_such_procs_xyz'")


def test_a_missing_processor_module_is_one_line_and_exit_2_with_no_restarts(tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a role that connected first would wait for it
        nobody = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"
        env = {**without_settings(os.environ), "TASKPORT_PROCESSORS": "no_such_procs_xyz"}
        runs = {
            "up": {"TASKPORT_DATA_DIR": str(tmp_path / "up"), "PORT": str(free_port())},  # its embedded Redis
            "web": {"REDIS_URL": nobody, "PORT": str(free_port())},
            "worker": {"REDIS_URL": nobody}, "scheduler": {"REDIS_URL": nobody}, "deliverer": {"REDIS_URL": nobody},
        }
        procs = {role: subprocess.Popen([sys.executable, "-m", "app.launch.cli", role], cwd=REPO_ROOT,
                                        env={**env, **extra}, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT, text=True) for role, extra in runs.items()}
        results = {role: (proc.communicate(timeout=60)[0], proc.returncode) for role, proc in procs.items()}
    for role, (out, code) in results.items():
        assert (code, out.strip().splitlines()) == (EXIT_CONFIG, [LINE]), f"{role}: exit {code}, output:\n{out}"
    assert not (tmp_path / "up").exists() or not any((tmp_path / "up").rglob("*.log"))  # nothing was started
