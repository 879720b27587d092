"""The launcher with real processes: the embedded redis-server, the harness itself and ``taskport up``."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from rq import Worker

from app.cli import exit_code, web_command
from app.config import Config
from app.embedded import EmbeddedRedis, EmbeddedRedisError, alive, kill_session, session_members
from app.logs import make_handler, task_logger
from tests.integration.harness import CONFIG_VARIABLES, REPO_ROOT, RedisServer, Stack, WaitTimeout, wait_until

# -- wait_until ---------------------------------------------------------------------------------------


def test_wait_until_returns_the_first_truthy_value() -> None:
    calls = iter([0, None, "", "ready"])
    assert wait_until(lambda: next(calls), timeout=1, interval=0) == "ready"


def test_wait_until_fails_with_its_message() -> None:
    with pytest.raises(WaitTimeout, match="the moon"):
        wait_until(lambda: False, timeout=0.05, message=lambda: "the moon")


# -- embedded redis-server ---------------------------------------------------------------------------


def test_embedded_redis_runs_on_loopback_with_aof_only(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory()
    conn = server.client(decode_responses=True)
    assert conn.ping()
    assert conn.config_get("bind")["bind"] == "127.0.0.1"
    assert conn.config_get("appendonly")["appendonly"] == "yes"
    assert conn.config_get("save")["save"] == ""
    assert conn.config_get("protected-mode")["protected-mode"] == "yes"
    assert server.pid is not None and alive(server.pid)


def test_keys_survive_a_clean_restart_on_the_same_dir(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory()
    server.client().set("k", "v", ex=3600)
    old_pid = server.pid
    server.restart()
    conn = server.client()
    assert server.pid != old_pid
    assert conn.get("k") == b"v"
    assert 0 < conn.ttl("k") <= 3600


@pytest.mark.parametrize("fsync, settle", [("always", 0.0), ("everysec", 1.1)])
def test_kill9_keeps_keys_written_before_the_fsync_window(
    redis_factory: Callable[..., RedisServer], fsync: str, settle: float
) -> None:
    server = redis_factory(fsync=fsync)
    server.client().set("k", "v", ex=3600)
    time.sleep(settle)  # the durability promise under test: everysec loses at most the last second
    server.restart(kill=True)
    assert server.client().get("k") == b"v"


def test_a_second_owner_of_a_data_dir_is_refused(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory()
    second = EmbeddedRedis(server.config)
    with pytest.raises(EmbeddedRedisError, match="in use by another running taskport"):
        second.start()
    assert server.client().ping()


def test_an_orphan_server_left_by_a_killed_launcher_is_shut_down_first(tmp_path: Path) -> None:
    with subprocess.Popen([sys.executable, "-c", ORPHAN_MAKER, str(tmp_path)], cwd=REPO_ROOT,
                          stdout=subprocess.PIPE, text=True) as launcher:
        assert launcher.stdout is not None
        orphan = int(launcher.stdout.readline())
        launcher.kill()
    try:
        assert alive(orphan)
        with EmbeddedRedis(Config.from_env({}, data_dir=tmp_path)) as server:
            assert not alive(orphan)
            assert server.client().get("k") == b"v"
    finally:
        kill_session(orphan)


ORPHAN_MAKER = """
import sys, time
from app.config import Config
from app.embedded import EmbeddedRedis
server = EmbeddedRedis(Config.from_env({}, data_dir=sys.argv[1])).start()
server.client().set("k", "v")
print(server.pid, flush=True)
time.sleep(600)
"""


def test_a_foreign_process_on_the_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(EmbeddedRedisError, match=f"port {port} .* in use"):
            EmbeddedRedis(Config.from_env({}, data_dir=tmp_path), port=port).start()


def task_workers(conn: redis.Redis) -> list[Worker]:
    """The RQ workers serving task queues (not the scheduler's housekeeper, which serves only its own)."""
    return [w for w in Worker.all(connection=conn) if "default" in w.queue_names()]


# -- the harness's Stack -----------------------------------------------------------------------------


def test_stack_processes_start_ready_and_leave_nothing_behind(stack: Stack, redis_conn: redis.Redis) -> None:
    stack.start_web()
    workers = stack.start_worker(n=2, name="pair")
    stack.start_scheduler()
    assert {w.name for w in task_workers(redis_conn)} == {"pair-1", "pair-2"}
    members = {pid for p in stack.procs for pid in session_members(p.pid)}
    assert len(members) >= len(stack.procs)

    stack.kill9(workers[0])
    assert not session_members(workers[0].pid)
    stack.stop_all()
    assert [p.returncode for p in stack.procs if p is not workers[0]] == [0, 0, 0]
    wait_until(lambda: not any(alive(pid) for pid in members), timeout=5, message="every process to be gone")


# -- taskport up -------------------------------------------------------------------------------------


class Up:
    """``python -m app.cli up`` in its own session, its output in a file."""

    def __init__(self, workdir: Path, **env: str) -> None:
        self.log_path = workdir / "up.log"
        settings = {
            "PORT": str(_free_port()), "TASKPORT_REDIS_PORT": "0", "TASKPORT_DATA_DIR": str(workdir / "var"),
            "TASKPORT_HOST": "127.0.0.1", "WEB_CONCURRENCY": "1", "TASKPORT_WORKERS": "2", **env}
        inherited = {k: v for k, v in os.environ.items() if k not in CONFIG_VARIABLES}
        with open(self.log_path, "wb") as out:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "up"], cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**inherited, **settings, "PYTHONUNBUFFERED": "1"}, start_new_session=True)

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
        return int(self._find(r"embedded Redis \(pid (\d+)\)")[0])

    def redis_url(self) -> str:
        return str(self._find(r"embedded Redis \(pid \d+\) on (\S+),")[0])

    def child_pids(self) -> list[int]:
        return [int(pid) for pid in self._find(r"\S+ started \(pid=(\d+)\)")]

    def _find(self, pattern: str) -> list[str]:
        found = re.findall(pattern, self.output())
        assert found, f"{pattern!r} not in:\n{self.output()}"
        return found

    def kill_everything(self) -> None:
        """Test cleanup whatever happened: no process of this run may survive the test."""
        pids = re.findall(r"(?:started \(pid=|embedded Redis \(pid )(\d+)", self.output())
        for pid in [self.popen.pid, *map(int, pids)]:
            kill_session(pid)
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait()


@pytest.fixture
def up_factory(tmp_path: Path) -> Iterator[Callable[..., Up]]:
    runs: list[Up] = []

    def start(**env: str) -> Up:
        runs.append(Up(tmp_path, **env))
        return runs[-1]

    yield start
    for run in runs:
        run.kill_everything()


def test_up_runs_everything_and_sigterm_leaves_no_process(up_factory: Callable[..., Up]) -> None:
    up = up_factory()
    up.wait_for("taskport is up: http://127.0.0.1:")
    conn = redis.Redis.from_url(up.redis_url())
    wait_until(lambda: len(task_workers(conn)) == 2, message="both workers to register")
    conn.close()
    children = up.child_pids()
    assert len(children) == 4  # web, worker.1, worker.2, scheduler
    pids = {up.redis_pid(), *children, *(m for c in children for m in session_members(c))}
    assert all(alive(pid) for pid in pids)

    up.popen.send_signal(signal.SIGTERM)
    assert up.popen.wait(timeout=30) == 0, up.output()
    assert not [pid for pid in pids if alive(pid)], up.output()


def test_up_fails_when_a_child_fails_and_still_stops_redis(up_factory: Callable[..., Up]) -> None:
    up = up_factory(TASKPORT_PROCESSORS="tests.integration.no_such_processor_module")
    up.wait_for("embedded Redis (pid")
    redis_pid = up.redis_pid()
    rc = up.popen.wait(timeout=30)
    assert rc != 0, up.output()
    assert "no_such_processor_module" in up.output()
    assert not alive(redis_pid)
    assert not [pid for pid in up.child_pids() if alive(pid)]


def test_up_refuses_a_redis_port_taken_by_someone_else(up_factory: Callable[..., Up]) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        up = up_factory(TASKPORT_REDIS_PORT=str(listener.getsockname()[1]))
        assert up.popen.wait(timeout=30) == 1
    assert "is in use by another process" in up.output()
    assert "started (pid=" not in up.output()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- what every process shares: the gunicorn command line, the log format, exit codes ---------------


def test_the_gunicorn_command_line_is_valid_for_the_installed_gunicorn(tmp_path: Path) -> None:
    config = Config.from_env({}, redis_url="redis://127.0.0.1:1/0", data_dir=tmp_path, port=_free_port())
    command = [*web_command(config), "--check-config"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
                          env={**os.environ, **config.child_environ()})
    assert done.returncode == 0, done.stdout + done.stderr
    assert command[command.index("--worker-class") + 1] == "app.webworker.GeventWorker"


def test_log_lines_carry_the_task_id_or_a_dash() -> None:
    stream = io.StringIO()
    handler = make_handler("worker")
    handler.stream = stream
    log = logging.getLogger("tests.logs")
    log.addHandler(handler)
    log.propagate = False
    try:
        task_logger(log, "t-1").warning("with %s", "task")
        log.warning("without")
    finally:
        log.removeHandler(handler)
    first, second = stream.getvalue().splitlines()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert re.fullmatch(stamp + r" WARNING worker\[\d+\] tests.logs task_id=t-1 with task", first)
    assert second.endswith(" tests.logs task_id=- without")


@pytest.mark.parametrize("honcho_rc, rc", [(130, 0), (143, 0), (None, 1), (0, 1), (3, 3), (-9, 137)])
def test_up_exit_code(honcho_rc: int | None, rc: int) -> None:
    assert exit_code(honcho_rc) == rc
