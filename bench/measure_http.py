"""HTTP measurements: each runs ``bench.loadgen`` in its own process against the running gunicorn.

Also the load generator's own ceiling: the same generator against ``bench.canned`` (a server that does
nothing per request), so the report can show the generator pushes far more than gunicorn serves.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from rq import Worker

from app.core import keys
from app.core.process import free_port, port_in_use
from app.core.states import QUEUES
from bench.apps import GET_KEY, GET_VALUE
from bench.counting import command_delta, commandstats, per_op, text
from bench.stack import REPO, Stack


def loadgen(port: int, kind: str, *, conns: int, warmup: float, duration: float, ids_file: str | None = None,
            base: int = 0, env: dict[str, str] | None = None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.loadgen", "--port", str(port), "--kind", kind, "--conns", str(conns),
            "--warmup", str(warmup), "--duration", str(duration), "--base", str(base)]
    if ids_file:
        argv += ["--ids", ids_file]
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=warmup + duration + 60,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"loadgen {kind} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if result["errors"]:
        raise RuntimeError(f"loadgen {kind}: unexpected statuses {result['errors']}")
    return result


def with_commands(conn: redis.Redis, run: Any) -> dict[str, Any]:
    """Run a loadgen measurement and add the Redis commands per request (INFO commandstats delta over
    every request sent, warm-up included, since the server counts those too)."""
    before = commandstats(conn)
    result: dict[str, Any] = run()
    delta = command_delta(before, commandstats(conn))
    result["commands_per_request"] = per_op(delta, max(int(result["submitted_total"]), 1))
    return result


def loadgen_ceiling(stack: Stack, conns: int, warmup: float, duration: float) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "bench.canned", str(port)], cwd=REPO, env=stack.environ(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not port_in_use(port):
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the canned server did not start")
            time.sleep(0.05)
        return loadgen(port, "canned", conns=conns, warmup=warmup, duration=duration, env=stack.environ())
    finally:
        server.terminate()
        server.wait(10)


def best(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest round, with every round's throughput beside it: interference from other processes on
    the machine only ever slows a round down, so the best of N is the closest to an undisturbed run (the
    same rule for the baseline and the measured side)."""
    top = dict(max(rounds, key=lambda r: float(r["rps"])))
    top["rounds_rps"] = [r["rps"] for r in rounds]
    return top


@contextmanager
def listening_worker(conn: redis.Redis) -> Iterator[None]:
    """An RQ worker registered on every queue that never takes a job: to the web, as in production, a
    worker listens, so a submit takes its usual path, not the "no worker listens on this queue" warning
    (which reads the task back, counts it and logs a WARNING line: ~1/3 of a submit's time in-process)."""
    worker = Worker(list(QUEUES), connection=conn)
    worker.register_birth()
    try:
        yield
    finally:
        worker.register_death()


def http_phases(stack: Stack, conns: int, warmup: float, duration: float, rounds: int) -> dict[str, Any]:
    """hello and submit, then one GET and status reads of the submitted tasks, each pair alternating for
    ``rounds`` rounds. No worker runs meanwhile (none is started before the worker phases), so workers
    neither steal CPU nor change the tasks being read; one is registered (:func:`listening_worker`)."""
    conn = stack.client()
    with listening_worker(conn):
        return _http_phases(stack, conn, conns, warmup, duration, rounds)


def _http_phases(stack: Stack, conn: redis.Redis, conns: int, warmup: float, duration: float,
                 rounds: int) -> dict[str, Any]:
    conn.set(GET_KEY, GET_VALUE)
    env = stack.environ()
    port = stack.config.port
    found: dict[str, list[dict[str, Any]]] = {"hello": [], "submit": [], "get": [], "bare_get": [], "status": []}
    ids_file = stack.dir / "task-ids.txt"
    bare, bare_port = stack.start_bare_web()

    def one(kind: str, i: int) -> None:
        target, sent = (bare_port, "get") if kind == "bare_get" else (port, kind)
        found[kind].append(with_commands(conn, lambda: loadgen(
            target, sent, conns=conns, warmup=warmup if i == 0 else min(warmup, 1.0), duration=duration,
            ids_file=str(ids_file) if kind == "status" else None, base=i * 10_000_000, env=env)))

    for i in range(rounds):
        one("hello", i)
        one("submit", i)
    ids = [text(m) for m in conn.zrange(keys.history("public"), 0, 19_999)]
    ids_file.write_text("\n".join(ids))
    for i in range(rounds):
        one("get", i)
        one("bare_get", i)
        one("status", i)
    stack.stop(bare)
    conn.close()
    out = {kind: best(results) for kind, results in found.items()}
    out["status"]["distinct_tasks_read"] = len(ids)
    return out
