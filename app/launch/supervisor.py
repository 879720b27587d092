"""``taskport up``: the embedded redis-server and every process of the Procfile, kept up by supervisor.

Why supervisor (http://supervisord.org, pure Python, maintained since 2004, one dependency-free wheel):
honcho stops everything when one process exits; RQ's ``worker-pool`` restarts workers only, not the web,
the scheduler or Redis; circus restarts too but brings ZeroMQ and tornado. supervisor restarts any
program, starts and stops them in priority order, signals a whole process group, and logs one line per
exit (``exited: worker.1 (terminated by SIGKILL; not expected)``). See docs/self-healing.md.

The policy written into the generated ``supervisord.conf`` (app.launch.supervisorconf renders it):
- a process that dies is started again at once if it had been up ``START_SECS``; one that dies sooner
  failed to start, and is retried after 1, 2, 3 s (supervisor's BACKOFF state). After ``START_RETRIES``
  failed starts in a row supervisor gives up (FATAL): the watchdog below then stops everything and
  ``up`` exits 1 -- a worker that cannot import its processors is a configuration error, not a blip;
- the embedded redis-server runs first and stops last, on the same port and data dir each time;
- Ctrl-C or SIGTERM to ``up`` stops the web, the workers and the scheduler together (SIGTERM, then
  SIGKILL to the process group after ``STOP_WAIT`` s), then Redis (which flushes its AOF). Another
  SIGTERM meanwhile (make forwards the one its process group got; platforms repeat theirs) changes
  nothing: the stop goes on as it began, and whatever is left after ``STOP_DEADLINE`` s is killed.

This module's main (app.launch.supervisorconf.LAUNCHER) is also what runs under supervisord: supervisord itself,
the watchdog and the web's settings wrapper, whose code is app.launch.supervised.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType

import redis

from app.core.config import Config, without_settings
from app.core.process import die_with_parent, kill_session
from app.launch.embedded import EmbeddedRedis, EmbeddedRedisError
from app.launch.supervised import SUPERVISORD_FLAG, run_supervisord, watch, with_web_env
from app.launch.supervisorconf import (
    GAVE_UP,
    LAUNCHER,
    REDIS_STOP_WAIT,
    STOP_WAIT,
    WEB_ENV,
    WEB_ENV_FLAG,
    render,
)

STOP_DEADLINE = STOP_WAIT + REDIS_STOP_WAIT + 5  # after the workers' stop grace: see stop_deadline()
TICK = 1.0  # seconds between two looks at supervisord when nothing woke `up` (a signal or its exit does)
POLL = 0.1  # the same without a pidfd (not Linux), where only a look tells that supervisord exited
READY_TIMEOUT = 60.0  # seconds `up` waits for the web to answer /healthz before saying so


def stop_deadline(config: Config) -> float:
    """Seconds from a stop request until whatever ``up`` started is killed: the workers' grace, then the rest."""
    return config.stop_grace + STOP_DEADLINE


def web_only_environ(config: Config) -> dict[str, str]:
    """The settings only the web gets (API keys, operator credentials...): see Config.child_environ."""
    shared = config.child_environ("worker")
    return {k: v for k, v in config.child_environ("web").items() if shared.get(k) != v}


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
        self.embedded = None if config.external_redis else EmbeddedRedis(config)
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()  # set once `up` is on its way out, for whatever reason (never by a handler)
        self.requested = False  # a Ctrl-C or SIGTERM asked for the stop: all the signal handler does
        self.stop_asked: float | None = None  # when supervisord was asked to stop (time.monotonic())
        self._wakeup: socket.socket | None = None  # the read end of the signal wakeup socket pair
        self._wakeup_writer: socket.socket | None = None
        self._previous_wakeup_fd = -1

    def run(self) -> int:
        """Run until Ctrl-C/SIGTERM (0), or until supervisor gave up on a process or died itself (1)."""
        config = self.config
        if self.embedded is not None:
            self.embedded.claim()
            config = replace(config, redis_url=self.embedded.url)
        rc = 0
        try:
            _append_to_stdout()
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            (self.state_dir / GAVE_UP).unlink(missing_ok=True)
            conf = self.state_dir / "supervisord.conf"
            _write_private(conf, render(config, self.state_dir, self.embedded.command() if self.embedded else None))
            _write_private(self.state_dir / WEB_ENV, json.dumps(web_only_environ(config)))
            self._install_signal_handlers()
            if not self.requested:  # a stop asked for already: start nothing
                self._start(conf, config)
                self._await_redis()
                threading.Thread(target=announce_when_ready, args=(config, self.stopping), daemon=True).start()
                rc = self._supervise()
        finally:
            self._shut_down()
        return self._exit_code(rc)

    def _start(self, conf: Path, config: Config) -> None:
        env = secret_free(config)
        command = [sys.executable, "-m", LAUNCHER, SUPERVISORD_FLAG, "--configuration", str(conf)]
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
            while not self.requested and self.proc is not None and self.proc.poll() is None:
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
        """Ctrl-C and SIGTERM ask for the stop; the main loop (``_supervise``) carries it out.

        The handler sets a flag and does nothing else: a second signal can run it again in the middle of
        its first run (make forwards the SIGTERM its process group got; platforms send more than one), and
        whatever takes a lock there (``Event.set``, logging, ``print``) would then wait for itself forever.
        What wakes the loop is the wakeup socket: the interpreter writes a byte to it on every signal, at
        C level, before any Python handler runs."""
        self._wakeup, self._wakeup_writer = socket.socketpair()
        self._wakeup.setblocking(False)
        self._wakeup_writer.setblocking(False)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._wakeup_writer.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGINT, self._request_stop)
        signal.signal(signal.SIGTERM, self._request_stop)

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        """The SIGINT/SIGTERM handler: one attribute set and no call, so re-entering it cannot block."""
        self.requested = True

    def _supervise(self) -> int:
        """Wait for supervisord to end and return its status, asking it to stop (once) when a signal asked
        ``up`` to. Woken by a signal (the wakeup socket) and by supervisord's exit (a pidfd), else every TICK s.
        Should supervisord still run ``STOP_DEADLINE`` s after the request, return: ``_stop`` kills it."""
        assert self.proc is not None and self._wakeup is not None
        with _exit_watch(self.proc.pid) as exited:
            while (rc := self.proc.poll()) is None:
                if self.requested:
                    self._ask_stop()
                timeout = TICK if exited else POLL
                if (left := self._stop_time_left()) is not None:
                    if left <= 0:
                        break
                    timeout = min(timeout, left)
                select.select([self._wakeup.fileno(), *exited], [], [], timeout)
                _drain(self._wakeup)
        return rc if rc is not None else 0

    def _ask_stop(self) -> None:
        """SIGTERM to supervisord, its orderly stop, the first time only: a later request changes nothing."""
        if self.stop_asked is None and self.proc is not None:
            self.stop_asked = time.monotonic()
            self.stopping.set()
            self.proc.send_signal(signal.SIGTERM)

    def _stop_time_left(self) -> float | None:
        """Seconds until the stop asked for must be over (None: no stop asked for yet)."""
        return None if self.stop_asked is None else self.stop_asked + stop_deadline(self.config) - time.monotonic()

    def _shut_down(self) -> None:
        """However the run ended: supervisord stopped, then whatever it left, then the data dir given up."""
        self.stopping.set()
        self._stop()
        if self.embedded is not None:
            self.embedded.stop_leftover()  # cleanly (AOF flushed), should supervisord have died first
        if self.proc is not None:
            kill_session(self.proc.pid)  # and whatever else it left: its children share its session
        if self.embedded is not None:
            self.embedded.release()
        self._close_wakeup()

    def _stop(self) -> None:
        """Have supervisord stop everything, and SIGKILL its process group if that outlasts STOP_DEADLINE."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self._ask_stop()
        try:
            self.proc.wait(max(0.0, self._stop_time_left() or 0.0))
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def _close_wakeup(self) -> None:
        """Hand the signal wakeup fd back (the handlers stay: a late SIGTERM must not kill `up` mid-exit)."""
        if self._wakeup is not None and self._wakeup_writer is not None:
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            self._wakeup.close()
            self._wakeup_writer.close()
            self._wakeup = self._wakeup_writer = None

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


@contextlib.contextmanager
def _exit_watch(pid: int) -> Iterator[list[int]]:
    """A pidfd of ``pid`` (readable once it exited: Linux 5.3+) in a list to select on; elsewhere none."""
    try:
        fds = [os.pidfd_open(pid)]
    except (AttributeError, OSError):
        fds = []
    try:
        yield fds
    finally:
        for fd in fds:
            os.close(fd)


def _drain(wakeup: socket.socket) -> None:
    """Read away the signal bytes the wakeup socket holds, so the next select waits again."""
    with contextlib.suppress(BlockingIOError):
        while wakeup.recv(4096):
            pass


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


def _write_private(path: Path, text: str) -> None:
    """Write ``path`` anew, readable by its owner only."""
    path.unlink(missing_ok=True)
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as fh:
        fh.write(text)


if __name__ == "__main__":
    if sys.argv[1] == WEB_ENV_FLAG:  # the web program: python -m app.launch.supervisor --web-env FILE COMMAND...
        with_web_env(Path(sys.argv[2]), sys.argv[3:])
    if sys.argv[1] == SUPERVISORD_FLAG:  # supervisord itself: python -m app.launch.supervisor --supervisord ARGS
        sys.exit(run_supervisord(sys.argv[2:]))
    sys.exit(watch(Path(sys.argv[1])))
