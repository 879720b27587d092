"""The launcher with real processes: the embedded redis-server, the harness itself and ``taskport up``."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from app.core.config import Config
from app.core.logs import make_handler, task_logger
from app.core.process import alive, free_port, kill_session, session_members
from app.launch.cli import web_command
from app.launch.embedded import EmbeddedRedis, EmbeddedRedisError
from tests.integration.harness import REPO_ROOT, Api, RedisServer, Stack, Up, WaitTimeout, task_workers, wait_until

pytestmark = pytest.mark.faults  # processes killed, signalled or failing: make test-faults

# -- wait_until ---------------------------------------------------------------------------------------


def test_wait_until_returns_the_first_truthy_value() -> None:
    calls = iter([0, None, "", "ready"])
    assert wait_until(lambda: next(calls), timeout=1, interval=0) == "ready"


def test_wait_until_fails_with_its_message() -> None:
    with pytest.raises(WaitTimeout, match="the moon"):
        wait_until(lambda: False, timeout=0.05, message=lambda: "the moon")


# -- embedded redis-server ---------------------------------------------------------------------------


def test_embedded_server_is_a_patched_valkey_on_a_private_unix_socket_with_aof_only(
    redis_factory: Callable[..., RedisServer]
) -> None:
    server = redis_factory()
    conn = server.client(decode_responses=True)
    assert conn.ping()
    info = conn.info("server")
    assert (info["server_name"], info["valkey_version"]) == ("valkey", "9.1.2"), info
    assert conn.config_get("port")["port"] == "0"  # no TCP listener
    assert conn.config_get("unixsocket")["unixsocket"] == str(server.socket)
    assert server.url == f"unix://{server.socket}?db=0"
    assert conn.config_get("appendonly")["appendonly"] == "yes"
    assert conn.config_get("save")["save"] == ""
    assert server.pid is not None and alive(server.pid)
    assert stat.S_IMODE(server.dir.stat().st_mode) == 0o700  # the socket's dir, and the AOF's
    assert stat.S_IMODE(server.socket.stat().st_mode) == 0o700
    assert server.dir.stat().st_uid == server.socket.stat().st_uid == os.geteuid()


NOBODY = 65534
PROBE = """import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(2)
try:
    s.connect(sys.argv[1])
    s.sendall(b"PING\\r\\n")
    print("answered", s.recv(64))
except OSError as exc:
    print("refused:", type(exc).__name__)
"""


def probe(path: Path) -> str:
    """Connect to the unix socket ``path`` and PING: "answered b'+PONG...'" or "refused: <error>"."""
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(2)
        try:
            s.connect(str(path))
            s.sendall(b"PING\r\n")
            return f"answered {s.recv(64)!r}"
        except OSError as exc:
            return f"refused: {type(exc).__name__}"


def probe_as_another_user(path: Path) -> str:
    """``probe(path)`` as the user nobody: in a forked child that drops root (as here and in CI), else
    through ``sudo -n -u nobody`` (a raw socket: nothing to import from a venv nobody may not read)."""
    if os.geteuid() != 0:
        out = subprocess.run(["sudo", "-n", "-u", f"#{NOBODY}", "--", "python3", "-I", "-c", PROBE, str(path)],
                             capture_output=True, text=True, timeout=30, cwd="/")
        return out.stdout.strip() or out.stderr.strip()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to nobody, probe, report, exit without running any cleanup
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            os.write(write, probe(path).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        text = answer.read().decode()
    os.waitpid(pid, 0)
    return text


def test_another_local_user_cannot_reach_the_embedded_server(redis_factory: Callable[..., RedisServer]) -> None:
    server = redis_factory()
    server.client().set("k", "v")
    assert probe_as_another_user(server.socket) == "refused: PermissionError"
    # the owner's identical probe answers: what stops the other user is the socket's directory, nothing else
    assert probe(server.socket) == "answered b'+PONG\\r\\n'"


def test_an_existing_data_dir_is_made_private(tmp_path: Path) -> None:
    config = Config.from_env({}, data_dir=tmp_path)
    Path(config.redis_dir).mkdir(mode=0o755)
    os.chmod(config.redis_dir, 0o755)  # as an earlier version, with a 022 umask, left it
    with EmbeddedRedis(config) as server:
        assert stat.S_IMODE(server.dir.stat().st_mode) == 0o700
        assert server.client().ping()


def test_a_socket_path_too_long_for_the_kernel_is_a_clear_error(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 100)
    with pytest.raises(EmbeddedRedisError, match="longer than a unix socket allows.*TASKPORT_DATA_DIR"):
        EmbeddedRedis(Config.from_env({}, data_dir=deep)).start()


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
from app.core.config import Config
from app.launch.embedded import EmbeddedRedis
server = EmbeddedRedis(Config.from_env({}, data_dir=sys.argv[1])).start()
server.client().set("k", "v")
print(server.pid, flush=True)
time.sleep(600)
"""


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


@pytest.mark.serial  # a duration under CPU contention: run alone (tests/README.md, "Speed")
@pytest.mark.parametrize("busy", [False, True], ids=["idle", "busy"])
def test_up_runs_everything_and_sigterm_leaves_no_process(up_factory: Callable[..., Up], busy: bool) -> None:
    up = up_factory()
    up.wait_for("taskport is up: http://127.0.0.1:")
    conn = redis.Redis.from_url(up.redis_url())
    wait_until(lambda: len(task_workers(conn)) == 2, message="both workers to register")
    conn.close()
    if busy:  # a task running in each worker: RQ's warm shutdown would wait for it; SIGKILL comes after 5 s
        with Api(up.base_url) as api:
            running = [api.create("demo.sleep", {"seconds": 60}, dedup_key=str(n)) for n in range(2)]
            for task_id in running:
                api.wait_for(task_id, "PROCESSING")
    children = up.child_pids()
    assert set(children) == {"redis", "web", "worker.1", "worker.2", "scheduler", "deliverer", "watchdog"}
    assert children["redis"] == up.redis_pid()
    supervisord = up.supervisord_pid()
    pids = {supervisord, *children.values(), *session_members(supervisord)}
    assert all(alive(pid) for pid in pids)

    started = time.monotonic()
    up.popen.send_signal(signal.SIGTERM)
    assert up.popen.wait(timeout=30) == 0, up.output()
    took = time.monotonic() - started
    assert not [pid for pid in pids if alive(pid)], up.output()
    assert took < 9, f"stopping took {took:.1f} s"  # measured ~2 s idle, ~2.4 s busy (runs put back, then Redis)
    # the terminal stays clean: no Python warning (gevent's MonkeyPatchWarning once was) and no traceback
    assert "Warning:" not in up.output() and "Traceback" not in up.output(), up.output()
    print(f"\nSIGTERM to `taskport up` ({'tasks running' if busy else 'idle'}): everything stopped in {took:.2f} s")


def test_up_cleans_up_after_a_killed_supervisord(up_factory: Callable[..., Up]) -> None:
    up = up_factory()
    up.wait_for("taskport is up: http://127.0.0.1:")
    supervisord = up.supervisord_pid()
    pids = {*up.child_pids().values(), *session_members(supervisord)}
    os.kill(supervisord, signal.SIGKILL)
    assert up.popen.wait(timeout=30) == 1, up.output()
    assert "supervisord ended by itself (status -9)" in up.output()
    assert not [pid for pid in pids if alive(pid)], up.output()
    assert "stopping redis-server pid" in up.output()  # cleanly (SIGTERM), so its AOF is complete


def test_supervisords_own_lines_come_in_the_format_of_every_other_line(up_factory: Callable[..., Up]) -> None:
    up = up_factory()
    up.wait_for("taskport is up: http://127.0.0.1:")
    up.popen.send_signal(signal.SIGTERM)
    assert up.popen.wait(timeout=30) == 0, up.output()
    out = up.output()
    assert not re.search(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", out, re.M), out  # supervisor's own format
    own = [line for line in out.splitlines() if " supervisord[" in line]
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
    assert own and all(re.fullmatch(stamp + r" [A-Z]+ +supervisord\[\d+\] supervisor task_id=- \S.*", line)
                       for line in own), own
    said = "\n".join(own)
    assert "spawned: 'web' with pid" in said and "stopped: web (exit status 0)" in said, said
    assert {"redis", "web", "worker.1", "worker.2", "scheduler"} <= set(up.child_pids())  # what the harness reads


# supervisor gives up only on starts that fail within its startsecs: a start-up slowed by contention counts as
# started, so the test needs the CPU to itself
@pytest.mark.serial
@pytest.mark.timeout(120)  # 4 failed starts (each a Python start-up) and 6 s of backoff: ~12 s idle, ~35 s loaded
def test_up_gives_up_on_a_process_that_keeps_failing_and_still_stops_redis(up_factory: Callable[..., Up]) -> None:
    up = up_factory(TASKPORT_PROCESSORS="tests.userprocs.worker_import_fails")
    up.wait_for("embedded Redis (pid")
    redis_pid = up.redis_pid()
    rc = up.popen.wait(timeout=100)
    assert rc == 1, up.output()
    out = up.output()
    assert "worker_import_fails" in out
    assert re.search(r"gave up: worker\.\d entered FATAL state, too many start retries too quickly", out), out
    assert re.search(r"taskport: stopped because worker\.\d(, worker\.\d)* kept failing to start", out), out
    assert not alive(redis_pid)
    assert not [pid for pid in up.child_pids().values() if alive(pid)]


# -- what every process shares: the gunicorn command line, the log format, exit codes ---------------


def test_the_gunicorn_command_line_is_valid_for_the_installed_gunicorn(tmp_path: Path) -> None:
    config = Config.from_env({}, redis_url="redis://127.0.0.1:1/0", data_dir=tmp_path, port=free_port())
    command = [*web_command(config), "--check-config"]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=30,
                          env={**os.environ, **config.child_environ()})
    assert done.returncode == 0, done.stdout + done.stderr
    assert command[command.index("--worker-class") + 1] == "app.web.webworker.GeventWorker"


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


