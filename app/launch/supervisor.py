"""``taskport up``: the embedded redis-server and every process of the Procfile, kept up by supervisor.

Why supervisor (http://supervisord.org, pure Python, maintained since 2004, one dependency-free wheel):
honcho stops everything when one process exits; RQ's ``worker-pool`` restarts workers only, not the web,
the scheduler or Redis; circus restarts too but brings ZeroMQ and tornado. supervisor restarts any
program, starts and stops them in priority order, signals a whole process group, and logs one line per
exit (``exited: worker.1 (terminated by SIGKILL; not expected)``). See docs/self-healing.md.

The policy written into the generated ``supervisord.conf``:
- a process that dies is started again at once if it had been up ``START_SECS``; one that dies sooner
  failed to start, and is retried after 1, 2, 3 s (supervisor's BACKOFF state). After ``START_RETRIES``
  failed starts in a row supervisor gives up (FATAL): the watchdog below then stops everything and
  ``up`` exits 1 -- a worker that cannot import its processors is a configuration error, not a blip;
- the embedded redis-server runs first and stops last, on the same port and data dir each time;
- Ctrl-C or SIGTERM to ``up`` stops the web, the workers and the scheduler together (SIGTERM, then
  SIGKILL to the process group after ``STOP_WAIT`` s), then Redis (which flushes its AOF).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import TextIO

import redis

from app.core.config import Config, without_settings
from app.core.process import die_with_parent, kill_session
from app.launch.embedded import EmbeddedRedis, EmbeddedRedisError

GROUP = "taskport"
START_SECS = 3  # a process that dies within this many seconds of its start failed to start
START_RETRIES = 3  # failed starts in a row (1 + 2 + 3 s of backoff) before supervisor gives up
STOP_WAIT = 5  # seconds between SIGTERM and SIGKILL: gunicorn's graceful timeout, RQ's warm shutdown
REDIS_STOP_WAIT = 10  # seconds redis-server gets to flush its append-only file on SIGTERM
WEB_ENV = "web-env.json"  # in the state dir, 0600: the settings only the web process gets
WEB_ENV_FLAG = "--web-env"
READY_TIMEOUT = 60.0  # seconds `up` waits for the web to answer /healthz before saying so
GAVE_UP = "gave-up"  # file the watchdog writes (with the process name) before it stops everything


@dataclass(frozen=True)
class Program:
    """One ``[program:x]`` section: what runs and how it is stopped."""

    name: str
    command: list[str]
    priority: int
    numprocs: int = 1
    stop_wait: int = STOP_WAIT
    as_group: bool = True  # signal the process group: gunicorn's workers, RQ's scheduler child

    def section(self, cwd: Path) -> str:
        lines = [
            f"[program:{self.name}]",
            f"command={_escape(shlex.join(self.command))}",
            f"directory={_escape(str(cwd))}",
            f"priority={self.priority}",
            "autostart=true",
            "autorestart=true",
            f"startsecs={START_SECS}",
            f"startretries={START_RETRIES}",
            "stopsignal=TERM",
            f"stopwaitsecs={self.stop_wait}",
            f"stopasgroup={str(self.as_group).lower()}",
            f"killasgroup={str(self.as_group).lower()}",
            "redirect_stderr=true",
            "stdout_logfile=/dev/stdout",  # supervisord's own stdout: the terminal of `make up`
            "stdout_logfile_maxbytes=0",
        ]
        if self.numprocs > 1:
            lines += ["process_name=%(program_name)s.%(process_num)d", f"numprocs={self.numprocs}", "numprocs_start=1"]
        return "\n".join(lines)


def web_only_environ(config: Config) -> dict[str, str]:
    """The settings only the web gets (API keys, operator credentials...): see Config.child_environ."""
    shared = config.child_environ("worker")
    return {k: v for k, v in config.child_environ("web").items() if shared.get(k) != v}


def with_web_env(env_file: Path, command: list[str]) -> None:
    """Exec ``command`` with the settings of ``env_file`` (JSON, written 0600 by the launcher) added to
    the environment: how the web alone gets its secrets under supervisor, whose own ``environment=``
    lines cannot carry every value (its parser has no escapes) and would hand them to every program."""
    os.environ.update(json.loads(env_file.read_text()))
    os.execv(command[0], command)


def programs(config: Config, redis_command: list[str] | None, state_dir: Path) -> list[Program]:
    """Everything ``up`` runs; ``redis_command`` is the embedded redis-server's (None with REDIS_URL)."""
    role = [sys.executable, "-m", "app.launch.cli"]
    web = [sys.executable, "-m", "app.launch.supervisor", WEB_ENV_FLAG, str(state_dir / WEB_ENV), *role, "web"]
    found = [
        Program("web", web, priority=10),
        Program("worker", [*role, "worker"], priority=10, numprocs=config.workers),
        Program("scheduler", [*role, "scheduler"], priority=10),
    ]
    if redis_command:
        found.insert(0, Program("redis", redis_command, priority=1, stop_wait=REDIS_STOP_WAIT, as_group=False))
    return found


def render(config: Config, state_dir: Path, redis_command: list[str] | None) -> str:
    """The whole ``supervisord.conf``."""
    procs = programs(config, redis_command, state_dir)
    cwd = Path.cwd()
    head = [
        "[supervisord]",
        "nodaemon=true",  # in the foreground, its log on stdout (not to a log file: /dev/null)
        "logfile=/dev/null",
        "logfile_maxbytes=0",
        "loglevel=info",
        f"pidfile={_escape(str(state_dir / 'supervisord.pid'))}",
        f"childlogdir={_escape(str(state_dir))}",
    ]
    if os.geteuid() == 0:  # as root supervisord logs a CRIT line unless told which user to stay
        head.append("user=root")
    task_programs = [p.name for p in procs if p.name != "redis"]
    watchdog = [
        "[eventlistener:watchdog]",
        f"command={_escape(shlex.join([sys.executable, '-m', 'app.launch.supervisor', str(state_dir / GAVE_UP)]))}",
        "events=PROCESS_STATE_FATAL",
        "priority=100",
        "autorestart=true",
        "stderr_logfile=/dev/stdout",
        "stderr_logfile_maxbytes=0",
    ]
    group = [f"[group:{GROUP}]", f"programs={','.join(task_programs)}", "priority=10"]
    sections = ["\n".join(head), *(p.section(cwd) for p in procs), "\n".join(group), "\n".join(watchdog)]
    return "\n\n".join(sections) + "\n"


def _escape(value: str) -> str:
    return value.replace("%", "%%")  # supervisor expands %(name)s in every value


def secret_free(config: Config) -> dict[str, str]:
    """supervisord's environment, inherited by every program: the caller's, minus every taskport setting
    (an API key exported in the shell included), plus what workers and the scheduler need. The web's
    own settings and secrets reach only the web, through a file only its owner can read (see with_web_env)."""
    return {**without_settings(os.environ), **config.child_environ("worker"), "PYTHONUNBUFFERED": "1"}


# -- the launcher ---------------------------------------------------------------------------------


class Launcher:
    """``taskport up``: claim the data dir, run supervisord in the foreground, forward Ctrl-C/SIGTERM."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.state_dir = Path(config.data_dir) / "supervisor"
        self.embedded = None if config.redis_url else EmbeddedRedis(config)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()  # set once `up` is on its way out, for whatever reason
        self.requested = False  # a Ctrl-C or SIGTERM asked for the stop

    def run(self) -> int:
        """Run until Ctrl-C/SIGTERM (0), or until supervisor gave up on a process or died itself (1)."""
        config = self.config
        if self.embedded is not None:
            self.embedded.claim()
            config = replace(config, redis_url=self.embedded.url)
        try:
            _append_to_stdout()
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            (self.state_dir / GAVE_UP).unlink(missing_ok=True)
            conf = self.state_dir / "supervisord.conf"
            _write_private(conf, render(config, self.state_dir, self.embedded.command() if self.embedded else None))
            _write_private(self.state_dir / WEB_ENV, json.dumps(web_only_environ(config)))
            self._install_signal_handlers()
            self._start(conf, config)
            self._await_redis()
            threading.Thread(target=announce_when_ready, args=(config, self.stopping), daemon=True).start()
            assert self.proc is not None
            rc = self.proc.wait()
        finally:
            self.stopping.set()
            self._stop()
            if self.embedded is not None:
                self.embedded.stop_leftover()  # cleanly (AOF flushed), should supervisord have died first
            if self.proc is not None:
                kill_session(self.proc.pid)  # and whatever else it left: its children share its session
            if self.embedded is not None:
                self.embedded.release()
        return self._exit_code(rc)

    def _start(self, conf: Path, config: Config) -> None:
        env = secret_free(config)
        command = [sys.executable, "-m", "supervisor.supervisord", "--configuration", str(conf)]
        # its own session: a Ctrl-C reaches `up` only, which stops supervisord (and so everything) in order;
        # and it gets SIGTERM should `up` itself be killed, however
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, start_new_session=True,
                                     preexec_fn=die_with_parent)

    def _await_redis(self) -> None:
        """Say where the embedded Redis is once it answers (workers and the web wait for it themselves)."""
        if self.embedded is None:
            return
        client = self.embedded.client(timeout=1.0)
        deadline = time.monotonic() + 30
        with contextlib.closing(client):
            while not self.stopping.is_set() and self.proc is not None and self.proc.poll() is None:
                with contextlib.suppress(redis.exceptions.ConnectionError):
                    if client.ping():
                        pid = self.embedded.server_pid()
                        print(f"embedded Redis (pid {pid}) on {self.embedded.url}, data in {self.embedded.dir}",
                              flush=True)
                        return
                if time.monotonic() > deadline:
                    raise EmbeddedRedisError(f"redis-server did not answer within 30 s:\n{self.embedded.log_tail()}")
                time.sleep(0.05)

    def _install_signal_handlers(self) -> None:
        def stop(signum: int, frame: FrameType | None) -> None:
            self.requested = True
            self.stopping.set()
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)  # supervisord's orderly shutdown
            else:
                raise SystemExit(0)

        signal.signal(signal.SIGINT, stop)
        signal.signal(signal.SIGTERM, stop)

    def _stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(STOP_WAIT + REDIS_STOP_WAIT + 5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _exit_code(self, supervisord_rc: int) -> int:
        gave_up = self.state_dir / GAVE_UP
        if gave_up.exists():
            names = ", ".join(sorted(set(gave_up.read_text().split()))) or "a process"
            print(f"taskport: stopped because {names} kept failing to start", flush=True)
            return 1
        if self.requested:
            return 0
        print(f"taskport: supervisord ended by itself (status {supervisord_rc}): everything is stopped", flush=True)
        return 1


def _append_to_stdout() -> None:
    """supervisord writes every process's output through ``/dev/stdout`` opened anew, in append mode.
    When our stdout is a file opened without O_APPEND (``taskport up > up.log``), our own lines would be
    written at our own offset, over theirs: append too."""
    with contextlib.suppress(OSError):
        if stat.S_ISREG(os.fstat(sys.stdout.fileno()).st_mode):
            flags = fcntl.fcntl(sys.stdout.fileno(), fcntl.F_GETFL)
            fcntl.fcntl(sys.stdout.fileno(), fcntl.F_SETFL, flags | os.O_APPEND)


def announce_when_ready(config: Config, done: threading.Event) -> None:
    """Print the URL once the web answers /healthz (so the line is true when it appears)."""
    host = config.local_host
    url = f"http://{host}:{config.port}/"
    deadline = time.monotonic() + READY_TIMEOUT
    while not done.wait(0.2):
        try:
            with urllib.request.urlopen(url + "healthz", timeout=1) as response:
                if response.status == 200:
                    print(f"taskport is up: {url} (data in {config.data_dir})", flush=True)
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            print(f"taskport: the web did not answer {url}healthz within {READY_TIMEOUT:.0f} s", flush=True)
            return


# -- the watchdog (a supervisor event listener) --------------------------------------------------


def watch(gave_up: Path, stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout,
          stop_all: Callable[[], None] | None = None) -> int:
    """Listen for PROCESS_STATE_FATAL (supervisor gave up restarting a process: the service is not whole
    any more): note which one in ``gave_up`` and have supervisord stop everything (``up`` then exits 1).
    Returns 0 when supervisord closes the pipe."""
    from supervisor import childutils

    stop_all = stop_all or (lambda: os.kill(os.getppid(), signal.SIGTERM))
    while True:
        childutils.listener.ready(stdout)
        line = stdin.readline()
        if not line:
            return 0
        headers = childutils.get_headers(line)
        payload = stdin.read(int(headers["len"]))
        if headers["eventname"] == "PROCESS_STATE_FATAL":
            name = childutils.get_headers(payload.split("\n", 1)[0])["processname"]
            print(f"taskport: {name} failed {START_RETRIES + 1} starts in a row: stopping everything",
                  file=sys.stderr, flush=True)
            with open(gave_up, "a") as marker:  # one append each: a second FATAL may come while stopping
                marker.write(name + "\n")
            stop_all()
        childutils.listener.ok(stdout)


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` anew, readable by its owner only."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    if sys.argv[1] == WEB_ENV_FLAG:  # the web program: python -m app.launch.supervisor --web-env FILE COMMAND...
        with_web_env(Path(sys.argv[2]), sys.argv[3:])
    sys.exit(watch(Path(sys.argv[1])))
