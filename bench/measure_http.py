"""HTTP measurements: each runs ``bench.loadgen`` in its own process against the running gunicorn.

Also the load generator's own ceiling: the same generator against ``bench.canned`` (a server that does
nothing per request), so the report can show the generator pushes far more than gunicorn serves; and the
batch rows of issue 21 (``POST /api/v1/batches`` of :data:`BATCH_SIZE` tasks beside the single submit, a
batch's status read beside a task's), which bench.measure_peers repeats with the workers running.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
import requests
from rq import Worker

from app.core import keys
from app.core.process import free_port, port_in_use
from app.core.states import QUEUES
from bench.apps import GET_KEY, GET_VALUE
from bench.counting import command_delta, commandstats, per_op, text
from bench.loadgen import batch_body
from bench.process_cpu import least as least_cpu
from bench.process_cpu import with_cpu
from bench.stack import REPO, Stack

BATCH_SIZE = 1000  # tasks per batch of the batch submit rows (the contract's largest)
BATCH_CONNS = 4  # "a few connections": 2 per web process; more only queue behind Redis (bench/README.md)
STATUS_BATCHES = {10: 20, 1000: 4}  # batch size -> how many batches of it the batch status rows cycle over
MIN_BATCH_WINDOW = 5.0  # seconds: a batch request takes ~1/2 s, and only answers inside the window count


def batch_window(duration: float) -> float:
    """The batch submit rows' window: twice the others' (a batch is ~1/2 s a request: more of them counted)."""
    return max(2 * duration, MIN_BATCH_WINDOW)
BATCH_BASE = 500_000_000  # first payload number of the batch rows: apart from the single submits' (no dedup hit)
STATUS_IDS = 20_000  # task ids the status rows cycle over


def loadgen(port: int, kind: str, *, conns: int, warmup: float, duration: float, ids_file: str | None = None,
            base: int = 0, env: dict[str, str] | None = None, size: int = BATCH_SIZE,
            bearers_file: str | None = None) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.loadgen", "--port", str(port), "--kind", kind, "--conns", str(conns),
            "--warmup", str(warmup), "--duration", str(duration), "--base", str(base), "--size", str(size)]
    if ids_file:
        argv += ["--ids", ids_file]
    if bearers_file:
        argv += ["--bearers", bearers_file]
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
def listening_worker(conn: redis.Redis) -> Iterator[Worker]:
    """An RQ worker registered on every queue that never takes a job: to the web, as in production, a
    worker listens, so a submit takes its usual path, not the "no worker listens on this queue" warning
    (which reads the task back, counts it and logs a WARNING line: ~1/3 of a submit's time in-process)."""
    worker = Worker(list(QUEUES), connection=conn)
    worker.register_birth()
    try:
        yield worker
    finally:
        worker.register_death()


def clean_slate(conn: redis.Redis, worker: Worker | None = None) -> None:
    """Redis flushed (a round's tasks gone: the batch rounds would otherwise pile up towards maxmemory), the
    one-GET key set again and, when given, the listening worker registered again."""
    conn.flushall()
    conn.set(GET_KEY, GET_VALUE)
    if worker is not None:
        worker.register_birth()


def make_batches(base_url: str, size: int, count: int, first: int) -> list[str]:
    """``count`` batches of ``size`` no-op tasks through ``POST /api/v1/batches`` (payloads numbered from
    ``first``): the ids the batch status rows read."""
    ids = []
    with requests.Session() as http:
        for i in range(count):
            answer = http.post(base_url + "/api/v1/batches", data=batch_body(first + i * size, size),
                               headers={"Content-Type": "application/json"}, timeout=60)
            if answer.status_code != 202:
                raise RuntimeError(f"batch submit {answer.status_code}: {answer.text[:500]}")
            ids.append(str(answer.json()["batch_id"]))
    return ids


def status_batches(stack: Stack, first: int) -> dict[int, Path]:
    """The batches of :data:`STATUS_BATCHES`, made now, as one ids file per batch size."""
    files = {}
    for n, (size, count) in enumerate(STATUS_BATCHES.items()):
        ids = make_batches(stack.base_url, size, count, first + n * 10_000_000)
        files[size] = stack.dir / f"batch-ids-{size}.txt"
        files[size].write_text("\n".join(ids))
    return files


def history_ids(conn: redis.Redis) -> list[str]:
    """The member's oldest :data:`STATUS_IDS` tasks (the status rows' reads)."""
    return [text(m) for m in conn.zrange(keys.history("public"), 0, STATUS_IDS - 1)]


def http_phases(stack: Stack, conns: int, warmup: float, duration: float, rounds: int) -> dict[str, Any]:
    """hello, submit and batch submit, then one GET, status and batch status reads, each set alternating for
    ``rounds`` rounds. No worker runs meanwhile (none is started before the worker phases), so workers
    neither steal CPU nor change the tasks being read; one is registered (:func:`listening_worker`)."""
    conn = stack.client()
    with listening_worker(conn) as worker:
        return _http_phases(stack, conn, worker, conns, warmup, duration, rounds)


def _http_phases(stack: Stack, conn: redis.Redis, worker: Worker, conns: int, warmup: float, duration: float,
                 rounds: int) -> dict[str, Any]:
    env = stack.environ()
    port = stack.config.port
    kinds = ("hello", "submit", "batch_submit", "get", "bare_get", "status", "batch_status_10", "batch_status_1000")
    found: dict[str, list[dict[str, Any]]] = {kind: [] for kind in kinds}
    ids_file = stack.dir / "task-ids.txt"
    bare, bare_port = stack.start_bare_web()
    batch_files: dict[int, Path] = {}

    def one(kind: str, i: int) -> None:
        target, sent, ids, seconds, base = port, kind.replace("_", "-"), None, duration, i * 10_000_000
        if kind == "bare_get":
            target, sent = bare_port, "get"
        elif kind == "status":
            ids = str(ids_file)
        elif kind.startswith("batch_status_"):
            sent, ids = "batch-status", str(batch_files[int(kind.rsplit("_", 1)[1])])
        elif kind == "batch_submit":
            seconds, base = batch_window(duration), BATCH_BASE + i * 100_000_000
        c = BATCH_CONNS if kind == "batch_submit" else conns
        groups = stack.cpu_groups(web=bare if kind == "bare_get" else stack.web)
        found[kind].append(with_cpu(groups, lambda: with_commands(conn, lambda: loadgen(
            target, sent, conns=c, warmup=warmup if i == 0 else min(warmup, 1.0), duration=seconds,
            ids_file=ids, base=base, env=env)), lambda r: int(r["submitted_total"])))

    ids: list[str] = []
    for i in range(rounds):
        clean_slate(conn, worker)  # each round from an empty Redis: the batch rounds add ~10,000s of tasks
        one("hello", i)
        one("submit", i)
        ids = history_ids(conn)  # this round's single submits
        one("batch_submit", i)
    ids_file.write_text("\n".join(ids))
    batch_files = status_batches(stack, BATCH_BASE + rounds * 100_000_000)
    for i in range(rounds):
        for kind in ("get", "bare_get", "status", "batch_status_10", "batch_status_1000"):
            one(kind, i)
    stack.stop(bare)
    conn.close()
    out = {kind: {**best(results), "least_cpu_ms_per_op": least_cpu(results)} for kind, results in found.items()}
    out["status"]["distinct_tasks_read"] = len(ids)
    for size, count in STATUS_BATCHES.items():
        out[f"batch_status_{size}"]["distinct_batches_read"] = count
    out["batch_submit"] = best_batches(found["batch_submit"])
    return out


def best_batches(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`best` for batch submit rounds, which count tasks: the round with the most tasks accepted per second."""
    top = dict(max(rounds, key=lambda r: float(r["tasks_per_s"])))
    top["rounds_tasks_per_s"] = [r["tasks_per_s"] for r in rounds]
    return top
