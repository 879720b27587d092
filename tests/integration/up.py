"""``taskport up`` as a user runs it (``python -m app.cli up`` in its own session), for the launcher and
self-healing tests: where its processes are, what it printed, and a cleanup that leaves nothing behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import redis
from rq import Worker

from app.config import without_settings
from app.process import alive, free_port, kill_session, read_pid
from tests.integration.harness import REPO_ROOT, wait_until


class Up:
    """One run of ``taskport up``; its output (supervisord's log and every process's) in ``up.log``."""

    def __init__(self, workdir: Path, **env: str) -> None:
        self.workdir = workdir
        self.log_path = workdir / "up.log"
        self.data_dir = workdir / "var"
        self.port = free_port()
        settings = {
            "PORT": str(self.port), "TASKPORT_DATA_DIR": str(self.data_dir),
            "TASKPORT_HOST": "127.0.0.1", "WEB_CONCURRENCY": "1", "TASKPORT_WORKERS": "2", **env}
        self.workers = int(settings["TASKPORT_WORKERS"])
        inherited = without_settings(os.environ)
        # truncating, as `taskport up > up.log` would: `up` makes it O_APPEND, as supervisord's own writes are
        with open(self.log_path, "wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "up"], cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**inherited, **settings, "PYTHONUNBUFFERED": "1"}, start_new_session=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30) -> str:
        def seen() -> str | None:
            out = self.output()
            if text in out:
                return out
            if self.popen.poll() is not None:
                raise AssertionError(f"`taskport up` exited {self.popen.returncode}:\n{out}")
            return None

        return wait_until(seen, timeout=timeout, message=lambda: f"{text!r} in:\n{self.output()}")

    def redis_pid(self) -> int:
        """The redis-server running now (its pidfile: supervisor restarts it under a new pid)."""
        pid = read_pid(self.data_dir / "redis" / "redis.pid")
        assert pid is not None, self.output()
        return pid

    def redis_url(self) -> str:
        return str(self._find(r"embedded Redis \(pid \d+\) on (\S+),")[0])

    def pid(self, name: str) -> int:
        """The pid supervisor last started ``name`` (web, worker.1, scheduler, redis...) under."""
        return int(self._find(rf"spawned: '{re.escape(name)}' with pid (\d+)")[-1])

    def child_pids(self) -> dict[str, int]:
        """Every supervised process's current pid, by name."""
        found = re.findall(r"spawned: '([^']+)' with pid (\d+)", self.output())
        return {name: int(pid) for name, pid in found}  # the last spawn of each name wins

    def exits(self, name: str) -> list[str]:
        """supervisor's one line per exit of ``name``: the status it ended with."""
        return re.findall(rf"exited: {re.escape(name)} \(([^)]*)\)", self.output())

    def supervisord_pid(self) -> int:
        pid = read_pid(self.data_dir / "supervisor" / "supervisord.pid")
        assert pid is not None, self.output()
        return pid

    def _find(self, pattern: str) -> list[str]:
        found = re.findall(pattern, self.output())
        assert found, f"{pattern!r} not in:\n{self.output()}"
        return found

    def kill_everything(self) -> None:
        """Test cleanup whatever happened: no process of this run may survive the test."""
        pids = re.findall(r"(?:spawned: '[^']+' with pid |embedded Redis \(pid )(\d+)", self.output())
        supervisord = read_pid(self.data_dir / "supervisor" / "supervisord.pid")
        for pid in [self.popen.pid, *([supervisord] if supervisord else []), *map(int, pids)]:
            kill_session(pid)
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()


def up_runs(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    """The body of an ``up_factory`` fixture: ``up_factory(**env)`` starts a run; all are killed after."""
    runs: list[Up] = []

    def start(**env: str) -> Up:
        workdir = tmp_path / f"up-{len(runs) + 1}"
        workdir.mkdir()
        runs.append(Up(workdir, **env))
        return runs[-1]

    yield start
    for run in runs:
        run.kill_everything()


def started(up_factory: Callable[..., Up], env: dict[str, str]) -> Up:
    """An ``up`` run with ``env``, returned once it says it is up and its task workers have registered."""
    up = up_factory(**env)
    up.wait_for("taskport is up: http://127.0.0.1:")
    conn = redis.Redis.from_url(up.redis_url())
    wait_until(lambda: len(task_workers(conn)) == up.workers, message="the workers to register")
    conn.close()
    return up


def task_workers(conn: redis.Redis) -> list[Worker]:
    """The RQ workers serving task queues (not the scheduler's housekeeper, which serves only its own)."""
    return [w for w in Worker.all(connection=conn) if "default" in w.queue_names()]


def children(pid: int) -> list[int]:
    """Live child pids of ``pid`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid and alive(int(entry.name)):
                found.append(int(entry.name))
    return found
