"""A submit's and a status read's cost before and after, in the same run: web CPU, Redis CPU, Redis commands.

Each tree (``git archive`` of two commits, main's 139e736 and HEAD by default) serves the real web as
``taskport web`` execs it (``app.launch.cli.web_command``: gunicorn, gevent), its app
``bench.apps:create_bench_app()`` (``app.web:create_app()`` plus the two baseline routes, ``/bench/hello``
among them), with the tree as its working directory and ``PYTHONPATH`` (its own ``app`` is imported, not the
checkout's), both against one valkey-server (``bench.stack.Stack``); each tree's bare Flask one-GET app
(``bench.apps:create_bare_app()``) runs beside them on the same argv, so that a change to the server (the
gunicorn worker class, its argv) shows in the bare app's row too. An RQ worker is registered and never takes a
job (``bench.measure_http.listening_worker``), as in ``make bench``.

A round, for each tree in turn (A B A B ...): Redis flushed, ``bench.loadgen --kind submit`` for
``--seconds``, then ``--kind status`` over the tasks that window created (PENDING in their line, as the
bench's status row reads them); then the same tasks run to COMPLETED by an in-process burst worker, read
again (``status, finished``); then the tree's bare app's ``GET /bench/get``, and ``GET /bench/hello`` through
taskport's app (every app-wide hook and the server, no view work: the per-request floor). Around each window: the CPU
(utime + stime from ``/proc``) of the gunicorn master and all its workers, the server's ``INFO cpu`` and
``INFO commandstats`` calls (a script counts as its EVALSHA plus every command it runs); divided by the
requests the generator sent (its warm-up included, as the server serves those too). CPU per operation is
the robust figure on a shared machine; req/s is given for the record, each status read against the bare
app's in the same round.

    .venv/bin/python bench/web_cpu_ab.py                            # 3 rounds, 3 s windows
    .venv/bin/python bench/web_cpu_ab.py --rounds 5 --before 139e736 --after HEAD
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # runnable as a script from anywhere

from app.core import keys  # noqa: E402
from app.core.config import Config, without_settings  # noqa: E402
from app.core.process import free_port  # noqa: E402
from app.core.states import QUEUES  # noqa: E402
from bench.counting import command_delta, commandstats  # noqa: E402
from bench.machine import CpuWatch, process_tree_cpu  # noqa: E402
from bench.measure_http import clean_slate, listening_worker, loadgen  # noqa: E402
from bench.stack import BARE_APP_SPEC, BENCH_APP_SPEC, Stack, bench_web_command  # noqa: E402
from bench.trees import before_and_after, table  # noqa: E402
from tests.integration.harness import wait_until  # noqa: E402

ROWS = (("web CPU ms / submit", "submit_web_ms", 3), ("Redis CPU ms / submit", "submit_redis_ms", 3),
        ("Redis commands / submit", "submit_commands", 2), ("submit req/s", "submit_rps", 0),
        ("web CPU ms / status (PENDING)", "status_web_ms", 3),
        ("Redis CPU ms / status (PENDING)", "status_redis_ms", 4),
        ("Redis commands / status (PENDING)", "status_commands", 2),
        ("web CPU ms / status (COMPLETED)", "done_web_ms", 3),
        ("Redis CPU ms / status (COMPLETED)", "done_redis_ms", 4),
        ("Redis commands / status (COMPLETED)", "done_commands", 2),
        ("status req/s (PENDING)", "status_rps", 0), ("status / bare one GET, same round", "status_vs_bare", 2),
        ("status req/s (COMPLETED)", "done_rps", 0), ("COMPLETED status / bare one GET", "done_vs_bare", 2),
        ("bare one GET web CPU ms", "bare_web_ms", 3), ("web CPU ms / hello (taskport's app)", "hello_web_ms", 3),
        ("hello req/s (taskport's app)", "hello_rps", 0))


class Web:
    """gunicorn with ``taskport web``'s argv, ``spec`` as its app, in ``tree`` (cwd and PYTHONPATH)."""

    def __init__(self, tree: Path, config: Config, spec: str, log: Path) -> None:
        self.port = free_port()
        config = replace(config, port=self.port)
        env = {**without_settings(os.environ), **config.child_environ(), "PYTHONPATH": str(tree),
               "PYTHONUNBUFFERED": "1"}
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(bench_web_command(config, spec), cwd=tree, env=env,
                                          stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        self.log = log

        def up() -> bool:
            if self.popen.poll() is not None:
                raise RuntimeError(f"web in {tree} exited:\n{log.read_text()[-3000:]}")
            path = "/bench/hello"
            return requests.get(f"http://127.0.0.1:{self.port}{path}", timeout=1).status_code == 200

        wait_until(up, timeout=60, ignore=(requests.RequestException,), message=lambda: log.read_text()[-3000:])

    def cpu(self) -> float:
        return process_tree_cpu(self.popen.pid)

    def stop(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(5)


def server_cpu(conn: Any) -> float:
    info = conn.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def window(conn: Any, web: Web, kind: str, seconds: float, env: dict[str, str], ids_file: str | None = None,
           base: int = 0) -> dict[str, float]:
    """One loadgen window against ``web``: per request, its web CPU, Redis CPU and Redis commands; and req/s."""
    before, redis0, web0 = commandstats(conn), server_cpu(conn), web.cpu()
    run = loadgen(web.port, kind, conns=16, warmup=0.5, duration=seconds, ids_file=ids_file, base=base, env=env)
    web_cpu, redis_cpu = web.cpu() - web0, server_cpu(conn) - redis0
    commands = sum(command_delta(before, commandstats(conn)).values())
    n = max(int(run["submitted_total"]), 1)
    return {"web_ms": web_cpu * 1000 / n, "redis_ms": redis_cpu * 1000 / n, "commands": commands / n,
            "rps": float(run["rps"])}


def complete(stack: Stack, n: int) -> None:
    """Run the ``n`` PENDING tasks to COMPLETED with an in-process simple worker in burst mode."""
    from workers import runner as runner_module
    from workers.worker import WORKER_CLASSES

    conn = stack.client()
    runner_module.use(runner_module.Runner(stack.config, conn))
    WORKER_CLASSES["simple"](list(QUEUES), connection=conn).work(burst=True, logging_level="WARNING")
    done = int(conn.hget(keys.STATS, "completed") or 0)
    if done < n:
        raise RuntimeError(f"{done} of {n} tasks COMPLETED")


def one_round(stack: Stack, conn: Any, worker: Any, web: Web, bare: Web, seconds: float, i: int,
              work: Path) -> dict[str, float]:
    env = stack.environ()
    clean_slate(conn, worker)
    sub = window(conn, web, "submit", seconds, env, base=i * 10_000_000)
    ids = [m.decode() for m in conn.zrange(keys.history("public"), 0, -1)]
    ids_file = work / "ids.txt"
    ids_file.write_text("\n".join(ids))
    pending = window(conn, web, "status", seconds, env, str(ids_file))
    bare_get = window(conn, bare, "get", seconds, env)
    hello = window(conn, web, "hello", seconds, env)
    worker.register_death()
    complete(stack, len(ids))
    worker.register_birth()
    done = window(conn, web, "status", seconds, env, str(ids_file))
    return {"submit_web_ms": sub["web_ms"], "submit_redis_ms": sub["redis_ms"], "submit_commands": sub["commands"],
            "submit_rps": sub["rps"], "status_web_ms": pending["web_ms"], "status_redis_ms": pending["redis_ms"],
            "status_commands": pending["commands"], "done_web_ms": done["web_ms"], "done_redis_ms": done["redis_ms"],
            "done_commands": done["commands"], "status_rps": pending["rps"],
            "status_vs_bare": pending["rps"] / bare_get["rps"], "done_rps": done["rps"],
            "done_vs_bare": done["rps"] / bare_get["rps"], "bare_web_ms": bare_get["web_ms"],
            "hello_web_ms": hello["web_ms"], "hello_rps": hello["rps"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="139e736")
    parser.add_argument("--after", default="HEAD")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="each window's measured time")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="web-cpu-ab-"))
    watch = CpuWatch().start()
    webs: list[Web] = []
    try:
        trees = before_and_after(args.before, args.after, work)
        names = (list(trees)[0], list(trees)[1])
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        with Stack() as stack:
            conn = stack.client()
            served = {name: Web(trees[name], stack.config, BENCH_APP_SPEC, work / f"web-{i}.log")
                      for i, name in enumerate(names)}
            bare = {name: Web(trees[name], stack.config, BARE_APP_SPEC, work / f"bare-{i}.log")
                    for i, name in enumerate(names)}
            webs += [*served.values(), *bare.values()]
            with listening_worker(conn) as worker:
                for i in range(args.rounds):
                    for name in names:
                        results[name].append(one_round(stack, conn, worker, served[name], bare[name], args.seconds,
                                                       i * 2 + names.index(name), work))
                        print(f"round {i + 1} {name}: " + ", ".join(
                            f"{key} {results[name][-1][key]:.{digits}f}" for _, key, digits in ROWS), flush=True)
            for web in webs:
                web.stop()
            webs.clear()
    finally:
        for web in webs:
            web.stop()
        shutil.rmtree(work, ignore_errors=True)
    machine = watch.report()
    print(f"\n{args.seconds:g} s windows (+0.5 s warm-up), 16 connections, {args.rounds} rounds each, alternating; "
          f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n")
    print(table(names, results, ROWS, ''))
    print(f"\nmachine: {json.dumps(machine)}")


if __name__ == "__main__":
    main()
