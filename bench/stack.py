"""The real stack the bench measures: an embedded redis-server in a temp dir, gunicorn, RQ workers.

gunicorn runs with exactly the argv ``taskport web`` execs (``app.launch.cli.web_command``), only the WSGI app
swapped for ``bench.apps:create_bench_app()``; taskport workers are ``python -m app.launch.cli worker``; the
bare-RQ baseline is RQ's own ``rq worker`` CLI with the same worker class and queues. Every child leads
its own session, and stopping one kills whatever is left in that session (an RQ work horse included).
Starting, awaiting and stopping a process are the test harness's (tests/integration/harness.py:
``launch``, ``wait_ready``, ``stop_procs``), so the bench and the tests share one set of guarantees.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import redis
import requests
from rq import Worker

from app.core.config import Config, without_settings
from app.core.process import free_port
from app.core.states import QUEUES
from app.launch.cli import web_command
from app.launch.embedded import EmbeddedRedis
from tests.integration.harness import REPO_ROOT, Proc, launch, stop_procs, wait_ready

REPO = REPO_ROOT
APP_SPEC = "app.web:create_app()"
BENCH_APP_SPEC = "bench.apps:create_bench_app()"
RQ_CLASSES = {"fork": "rq.worker.Worker", "simple": "rq.worker.SimpleWorker", "spawn": "rq.worker.SpawnWorker"}
# Settings a caller may change from the environment to try another configuration; everything else is
# taskport's default (the bench owns REDIS_URL, PORT, the data dir, the worker class and open mode).
PASSED_THROUGH = ("WEB_CONCURRENCY", "TASKPORT_WEB_WORKER_CLASS", "TASKPORT_WEB_THREADS", "TASKPORT_WORKERS",
                  "TASKPORT_LOG_LEVEL", "TASKPORT_REDIS_FSYNC", "TASKPORT_PROGRESS_INTERVAL",
                  "TASKPORT_HEARTBEAT_INTERVAL")


BARE_APP_SPEC = "bench.apps:create_bare_app()"
# The Celery worker's configurations (issue 23: the peer at its best): Celery 5's defaults (prefork, one child
# per CPU) and the tuning a user picks for short, I/O-light tasks; both with events on (-E). The faster of the
# two is the peer of every ratio (bench/report.py).
CELERY_POOLS = {"prefork": (), "threads": ("-P", "threads", "-c", "8")}
CELERY_POOL_NAMES = {"prefork": "prefork, one child per CPU (Celery's default)", "threads": "-P threads -c 8"}


def bench_web_command(config: Config, spec: str = BENCH_APP_SPEC) -> list[str]:
    """``taskport web``'s gunicorn argv with the bench app in place of taskport's (and nothing else changed)."""
    argv = web_command(config)
    if argv.count(APP_SPEC) != 1:
        raise RuntimeError(f"app.launch.cli.web_command no longer names {APP_SPEC!r} once: update bench/stack.py")
    return [spec if a == APP_SPEC else a for a in argv]


def tree_web_command(tree: Path, config: Config, environ: dict[str, str], spec: str = BENCH_APP_SPEC) -> list[str]:
    """:func:`bench_web_command` as the tree at ``tree`` (another commit's ``git archive``) builds it: its own
    ``web_command`` from ``config`` (passed through the environment, as to any child), so its flags are its own."""
    code = ("import json; from app.core.config import Config; from app.launch.cli import web_command; "
            "print(json.dumps(web_command(Config.from_env())))")
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=environ, capture_output=True, text=True,
                          check=True, timeout=60)
    argv: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    if argv.count(APP_SPEC) != 1:
        raise RuntimeError(f"{tree}'s web_command no longer names {APP_SPEC!r} once: update bench/stack.py")
    return [spec if a == APP_SPEC else a for a in argv]


def launch_in(tree: Path, name: str, argv: list[str], env: dict[str, str], log_path: Path) -> Proc:
    """``tests.integration.harness.launch`` with ``tree`` as the working directory instead of this checkout (a
    ``python -m`` and gunicorn put their cwd first on ``sys.path``: the tree's ``app`` and ``workers`` are run)."""
    with open(log_path, "ab") as out:
        popen = subprocess.Popen(argv, cwd=tree, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    return Proc(name, name, popen, log_path)


def wait_http(child: Proc, url: str, timeout: float) -> None:
    """Return once ``url`` answers 200; fail with the child's log if it exits first or the time is up."""
    wait_ready([child], lambda: requests.get(url, timeout=1).status_code == 200, timeout, f"{url} to answer 200")


class Stack:
    def __init__(self, keep: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="taskport-bench-"))
        self.keep = keep
        env = {k: os.environ[k] for k in PASSED_THROUGH if os.environ.get(k)}
        # maxmemory above the 1 GB default: the stored-tasks rows hold 1,000,000 finished tasks (bench.stored)
        base = Config.from_env(env, data_dir=self.dir, host="127.0.0.1", port=free_port(), api_keys="",
                               redis_maxmemory="4gb")
        self.redis_server = EmbeddedRedis(base)
        self.config = base
        self.children: list[Proc] = []
        self.web: Proc | None = None
        self.tree = REPO  # whose app/ and workers/ the processes run: another commit's tree for bench.before_after

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Stack:
        self.redis_server.start()
        self.config = replace(self.config, redis_url=self.redis_server.url)
        return self

    def close(self) -> None:
        for child in list(self.children):
            stop_procs(child, timeout=5)
        self.redis_server.close()
        if not self.keep:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def client(self, **kwargs: Any) -> redis.Redis:
        return redis.Redis.from_url(self.redis_server.url, **{"socket_timeout": 30, **kwargs})

    def environ(self, config: Config | None = None) -> dict[str, str]:
        inherited = without_settings(os.environ)
        path = os.pathsep.join(filter(None, [str(self.tree), os.environ.get("PYTHONPATH")]))
        return {**inherited, **(config or self.config).child_environ(), "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}

    def spawn(self, name: str, argv: list[str], config: Config | None = None) -> Proc:
        env, log = self.environ(config), self.dir / f"{name}.log"
        child = launch(name, argv, env, log) if self.tree == REPO else launch_in(self.tree, name, argv, env, log)
        self.children.append(child)
        return child

    def stop(self, *children: Proc) -> None:
        for child in children:
            stop_procs(child, timeout=10)
            if child in self.children:
                self.children.remove(child)
            if child is self.web:
                self.web = None

    # -- web ------------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.config.port}"

    def start_web(self, config: Config | None = None, timeout: float = 60.0) -> Proc:
        """gunicorn with ``config`` (default: the stack's), once it answers; a web already running is stopped."""
        if self.web is not None:
            self.stop(self.web)
        config = config or self.config
        argv = (bench_web_command(config) if self.tree == REPO
                else tree_web_command(self.tree, config, self.environ(config)))
        self.web = self.spawn("web", argv, config)
        wait_http(self.web, f"http://127.0.0.1:{config.port}/bench/hello", timeout)
        return self.web

    def start_bare_web(self, timeout: float = 60.0) -> tuple[Proc, int]:
        """The bare Flask app (``bench.apps.create_bare_app``) on the same gunicorn argv, on a port of its own."""
        config = replace(self.config, port=free_port())
        child = self.spawn("bare-web", bench_web_command(config, BARE_APP_SPEC), config)
        wait_http(child, f"http://127.0.0.1:{config.port}/bench/hello", timeout)
        return child, config.port

    def cpu_groups(self, **procs: Proc | Sequence[Proc] | None) -> dict[str, list[int]]:
        """The process groups of a window's CPU (``bench.process_cpu``): each named process (or list of them,
        e.g. the workers) by its pid, and the redis-server, broker and backend of every side alike."""
        groups = {name: [p.pid for p in ([found] if isinstance(found, Proc) else found)]
                  for name, found in procs.items() if found is not None}
        pid = self.redis_server.pid
        if pid is None:
            raise RuntimeError("the stack's redis-server is not running")
        return {**groups, "redis": [pid]}

    # -- the Celery + Flower peer ---------------------------------------------------------------
    @property
    def celery_url(self) -> str:
        """The embedded server's URL as Celery's broker (kombu) and result backend spell a unix socket."""
        url = urlsplit(self.redis_server.url)
        if url.scheme != "unix":
            return self.redis_server.url
        db = parse_qs(url.query).get("db", ["0"])[0]
        return f"redis+socket://{url.path}?virtual_host={db}"

    def celery_environ(self) -> dict[str, str]:
        return {**self.environ(), "BENCH_CELERY_REDIS": self.celery_url, "FLOWER_UNAUTHENTICATED_API": "true"}

    def start_flower(self, timeout: float = 60.0) -> tuple[Proc, int]:
        """Flower 2 (its REST API open, as the bench needs no auth) on a free port, once it answers."""
        port = free_port()
        argv = [sys.executable, "-m", "celery", "-A", "bench.celery_app", "flower", f"--port={port}",
                "--address=127.0.0.1", "--unix_socket="]
        child = launch("flower", argv, self.celery_environ(), self.dir / "flower.log")
        self.children.append(child)
        wait_http(child, f"http://127.0.0.1:{port}/api/workers?refresh=false", timeout)
        return child, port

    def start_celery_worker(self, pool: str = "prefork", timeout: float = 60.0) -> Proc:
        """A Celery worker in one of :data:`CELERY_POOLS` (events on, as Flower's info endpoint needs), once it
        answers a ping."""
        argv = [sys.executable, "-m", "celery", "-A", "bench.celery_app", "worker", "--loglevel=WARNING",
                "-E", "--without-gossip", "--without-mingle", *CELERY_POOLS[pool]]
        child = launch(f"celery-worker-{pool}", argv, self.celery_environ(), self.dir / f"celery-worker-{pool}.log")
        self.children.append(child)
        from bench.celery_app import app as celery_app

        celery_app.conf.broker_url = celery_app.conf.result_backend = self.celery_url
        wait_ready([child], lambda: celery_app.control.ping(timeout=0.5), timeout, "the Celery worker to answer a ping")
        return child

    # -- workers --------------------------------------------------------------------------------
    def start_workers(self, worker_class: str, count: int, *, bare: bool = False, timeout: float = 60.0,
                      config: Config | None = None) -> list[Proc]:
        """``count`` taskport workers (``python -m app.launch.cli worker``) or, with ``bare``, plain ``rq worker``s
        of the same class on the same queues, with ``config`` (the stack's by default); returns once all of them
        are registered in Redis."""
        config = replace(config or self.config, worker_class=worker_class)
        conn = self.client()
        before = {w.name for w in Worker.all(connection=conn)}
        started = []
        for i in range(count):
            kind = "rq" if bare else "taskport"
            name = f"{kind}-{worker_class}-{i}-{os.getpid()}-{time.monotonic_ns()}"
            if bare:
                argv = [sys.executable, "-m", "rq.cli", "worker", "--url", self.redis_server.url, "--with-scheduler",
                        "--worker-class", RQ_CLASSES[worker_class], "--name", name, *QUEUES]
            else:
                argv = [sys.executable, "-m", "app.launch.cli", "worker", "--name", name]
            started.append(self.spawn(f"worker-{name}", argv, config))
        try:
            wait_ready(started, lambda: len({w.name for w in Worker.all(connection=conn)} - before) >= count,
                       timeout, f"{count} workers to register")
        finally:
            conn.close()
        return started
