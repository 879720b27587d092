"""Redis-side figures: round trips (counted exactly, in-process), memory per finished task, housekeeping.

Round trips: the real code runs in this process over a real redis-server connection whose connections
count ``send_packed_command`` calls (:mod:`bench.counting`): submit and status through Flask's test
client on ``create_app(config, conn)``, an execution through ``workers.runner.Runner(config, conn).run``,
and a whole RQ delivery through an in-process ``SimpleWorker(...).work(burst=True)`` (RQ's round trips
plus ours; a burst on empty queues is subtracted as the worker's fixed cost).
"""

from __future__ import annotations

import itertools
import logging
import statistics
import time
import uuid
from dataclasses import replace
from typing import Any

import redis
from rq import SimpleWorker

from app.core import keys, processors
from app.core.clock import now_ms
from app.core.config import Config
from app.core.jobs import RESULT_TTL, JobQueue
from app.core.states import QUEUES
from app.core.store import TaskStore
from app.web import create_app
from app.web.service import TaskService
from bench.counting import CountingConnection, command_delta, commandstats, counting_client, per_op
from bench.fill import MEMBER, TASK_TYPE, create_tasks, enqueue_noops, noop_payload
from bench.measure_http import listening_worker
from bench.stack import Stack
from workers import runner as runner_module
from workers.housekeeping import Housekeeper, PassReport
from workers.worker import WORKER_CLASSES


class Counted:
    """Round trips (client side) and commands (server side) over a block of ``ops`` operations."""

    def __init__(self, plain: redis.Redis, ops: int) -> None:
        self.plain = plain
        self.ops = ops
        self.result: dict[str, Any] = {}

    def __enter__(self) -> Counted:
        CountingConnection.reset()
        self.before = commandstats(self.plain)
        return self

    def __exit__(self, *exc: Any) -> None:
        trips = CountingConnection.reset()
        delta = command_delta(self.before, commandstats(self.plain))
        self.result = {"round_trips": round(trips / self.ops, 3), "ops": self.ops,
                       "commands": per_op(delta, self.ops),
                       "commands_total": round(sum(delta.values()) / self.ops, 2)}


def round_trips(stack: Stack, n: int = 200) -> dict[str, Any]:
    """Per submit, per status read, per execution (Runner.run), all in-process on counting connections."""
    config = stack.config
    plain = stack.client()
    conn = counting_client(config)
    app = create_app(config, conn)
    logging.getLogger().setLevel(logging.WARNING)  # no INFO line per request on the bench's terminal
    client = app.test_client()

    def submit(i: int) -> str:
        answer = client.post("/api/v1/tasks", json={"type": TASK_TYPE, "payload": noop_payload(i)})
        assert answer.status_code == 202, answer.get_data(as_text=True)
        return str(answer.get_json()["task_id"])

    with listening_worker(plain):  # a submit's usual path (see listening_worker); before the web caches the count
        warm = [submit(50_000_000 + i) for i in range(5)]  # connection made, scripts loaded
        client.get(f"/api/v1/tasks/{warm[0]}")
        with Counted(plain, n) as submits:
            ids = [submit(60_000_000 + i) for i in range(n)]
    with Counted(plain, n) as reads:
        for task_id in ids:
            assert client.get(f"/api/v1/tasks/{task_id}").status_code == 200
    runner = runner_module.Runner(config, conn)
    runner.run(warm[0])
    with Counted(plain, n) as runs:
        for task_id in ids:
            runner.run(task_id)
    completed = sum(1 for t in TaskStore(plain, config).get_many(ids) if t and t.status == "COMPLETED")
    assert completed == n, f"only {completed} of {n} tasks COMPLETED"
    plain.close()
    return {"submit": submits.result, "status": reads.result, "execution": runs.result}


def worker_round_trips(stack: Stack, n: int = 200) -> dict[str, Any]:
    """One RQ delivery end to end (SimpleWorker, in-process): taskport's no-op task vs bare RQ's no-op."""
    config = stack.config
    plain = stack.client()
    conn = counting_client(config)
    runner_module.use(runner_module.Runner(config, conn))  # run_task uses this process's Runner

    def burst(fill: int, bare: bool) -> Counted:
        # taskport's own class (heartbeats coalesced, stop command honoured) vs RQ's SimpleWorker
        worker_class = SimpleWorker if bare else WORKER_CLASSES["simple"]
        plain.flushall()
        if fill and bare:
            enqueue_noops(plain, fill)
        elif fill:
            create_tasks(plain, config, fill, enqueue=True, base=70_000_000)
        with Counted(plain, max(fill, 1)) as counted:
            worker_class(list(QUEUES), connection=conn).work(burst=True, logging_level="WARNING")
        return counted

    out = {}
    for name, bare in (("taskport", False), ("bare_rq", True)):
        fixed, full = burst(0, bare), burst(n, bare)
        out[name] = {"round_trips": round((full.result["round_trips"] * n - fixed.result["round_trips"]) / n, 2),
                     "commands_total": round((full.result["commands_total"] * n - fixed.result["commands_total"]) / n,
                                             2)}
    runner_module.use(None)
    plain.flushall()
    plain.close()
    return out


# The transient keys a task leaves behind for a while, not for its result's lifetime: its dedup key (the
# member's window) and the call records of the scripts that wrote it (Config.call_record_ms). The memory row
# gives both a short life (_short_lived) and waits for them to lapse (_settled) before it reads used_memory.
TRANSIENT = (keys.dedup("*", "*"), keys.call("*"))


def _short_lived(config: Config) -> Config:
    """``config`` with the dedup window 1 s and the call records ~6 s (a 1 s ride-out: (1 + 2) × 2,000 ms)."""
    return replace(config, dedup_window=1, redis_ride_out=1.0)


def _settled(conn: redis.Redis, timeout: float = 60.0) -> None:
    """Until Redis's active expiry has reclaimed the TRANSIENT keys (dedup keys after their 1 s window, call
    records after their few seconds); RQ deletes a job without a result record at once (RESULT_TTL 0)."""
    deadline = time.monotonic() + timeout
    for pattern in TRANSIENT:
        while next(conn.scan_iter(match=pattern, count=5000), None) is not None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{pattern} keys still held {timeout} s after their short life")
            time.sleep(0.2)


def memory_per_task(stack: Stack, n: int = 10_000, worker_class: str = "simple", processes: int = 2
                    ) -> dict[str, Any]:
    """Redis memory a finished task holds for its result's lifetime: INFO used_memory over two rounds of
    ``n`` tasks each, submitted through ``TaskService.submit`` (in-process, the API's own path minus HTTP)
    and run to COMPLETED by real workers, each round measured once it has settled (the TRANSIENT keys
    reclaimed: dedup keys held 1 s here instead of the window's 300, call records ~6 s instead of 124; RQ's
    registries trimmed as housekeeping does). The figure is the second round's growth per task: what the
    first round also paid once (RQ's bounded window of finished jobs for rq-dashboard, the audit stream's
    first node, Redis's tables' first sizes) cancels out; the first round's figure is kept for the record.
    The dedup key's own cost, for its window only, is measured before it lapses; with a per-key-kind
    breakdown at the end."""
    plain = stack.client()
    plain.flushall()
    processors.load()
    config = _short_lived(stack.config)
    workers = stack.start_workers(worker_class, processes, config=config)
    try:
        time.sleep(0.5)
        service = TaskService(plain, config)
        used = [int(plain.info("memory")["used_memory"])]
        stats = [_memory_stats(plain)]
        peak_keys = []
        dedup_bytes = 0.0
        started = time.perf_counter()
        for round_ in (1, 2):
            for i in range(n):
                service.submit(MEMBER, TASK_TYPE, noop_payload(80_000_000 + round_ * n + i), None, None)
            if round_ == 1:
                held = list(itertools.islice(plain.scan_iter(match=keys.dedup("*", "*"), count=1000), 100))
                dedup_bytes = statistics.mean(int(plain.memory_usage(k, samples=0) or 0) for k in held) if held else 0
            _wait_completed(plain, round_ * n, timeout=240)
            peak_keys.append(int(plain.dbsize()))
            time.sleep(RESULT_TTL + 0.5)
            JobQueue(plain, config).trim_finished()
            _settled(plain)
            used.append(int(plain.info("memory")["used_memory"]))
            stats.append(_memory_stats(plain))
        elapsed = time.perf_counter() - started
    finally:
        stack.stop(*workers)
    breakdown = key_breakdown(plain, 2 * n)
    plain.close()
    return {"tasks": n, "bytes_per_task": round((used[2] - used[1]) / n, 1),
            "first_round_bytes_per_task": round((used[1] - used[0]) / n, 1), "used_memory": used,
            "dedup_key_bytes": round(dedup_bytes, 1), "seconds": round(elapsed, 1), "worker_class": worker_class,
            "processes": processes, "breakdown_bytes_per_task": breakdown,
            "keys_at_completion": peak_keys, "memory_stats": stats,
            "overhead_growth_bytes_per_task": {k: round((stats[2][k] - stats[1][k]) / n, 1) for k in stats[2]}}


def _memory_stats(conn: redis.Redis) -> dict[str, int]:
    """MEMORY STATS' parts that are not the keys' own bytes: the keyspace's and the expiry index's hash tables
    (sized in powers of two: a round's transient keys can leave them a step larger after they lapse), the
    clients' buffers, the AOF buffer, the script caches; and the keys' count, dataset bytes and the wake list's
    length (keys.JOB_WAKE: one entry per job queued since a worker last found nothing)."""
    raw = conn.execute_command("MEMORY STATS")
    db = raw.get("db.0", {})
    return {"hashtable.main": int(db.get("overhead.hashtable.main", 0)),
            "hashtable.expires": int(db.get("overhead.hashtable.expires", 0)),
            **{k: int(raw.get(k, 0)) for k in ("clients.normal", "aof.buffer", "lua.caches", "keys.count",
                                                "dataset.bytes", "overhead.total")},
            "job-wake entries": int(conn.llen(keys.JOB_WAKE))}


def _wait_completed(conn: redis.Redis, n: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while int(conn.hget(keys.STATS, "completed") or 0) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"not all {n} tasks COMPLETED within {timeout} s")
        time.sleep(0.1)


def _kind(key: str) -> str:
    if key.startswith(keys.PREFIX + "task:"):
        parts = key.removeprefix(keys.PREFIX + "task:").split(":")
        return "task " + (parts[1] if len(parts) > 1 else "hash")
    if key.startswith(keys.PREFIX + "dedup:"):
        return "dedup key"
    if key.startswith(keys.PREFIX + "call:"):
        return "call record"
    if key.startswith("rq:"):
        return "rq " + key.split(":")[1]
    return key


def key_breakdown(conn: redis.Redis, n: int) -> dict[str, float]:
    """MEMORY USAGE of every key, summed per kind of key, per task."""
    names = [k.decode() for k in conn.scan_iter(count=5000)]
    pipe = conn.pipeline(transaction=False)
    for name in names:
        pipe.memory_usage(name, samples=0)
    sizes: dict[str, int] = {}
    for name, size in zip(names, pipe.execute(), strict=True):
        sizes[_kind(name)] = sizes.get(_kind(name), 0) + int(size or 0)
    return {kind: round(size / n, 1) for kind, size in sorted(sizes.items(), key=lambda kv: -kv[1])}


def housekeeping(stack: Stack, live: int = 100_000, expired: int = 1000) -> dict[str, Any]:
    """``Housekeeper.expire`` over ``expired`` due tasks among ``live``: finished ones (the common case:
    results past their time), then, for the record, unfinished ones (PENDING, their RQ jobs queued)."""
    config = stack.config
    plain = stack.client()
    plain.flushall()
    started = time.perf_counter()
    ids = create_tasks(plain, config, live, enqueue=False, base=90_000_000)
    store = TaskStore(plain, config)
    for task_id in ids[:expired]:
        run_id = uuid.uuid4().hex
        store.start(task_id, run_id)
        store.complete(task_id, run_id, {"slept": 0, "items": 0}, items=None, failures=[], error_code=None)
    setup = time.perf_counter() - started
    finished = _expire(plain, config, ids[:expired], "expired_completed")
    live_tasks = int(plain.zcard(keys.EXPIRY))  # every task is in the expiry index, tombstones too
    pending = create_tasks(plain, config, expired, enqueue=True, base=95_000_000)
    unfinished = _expire(plain, config, pending, "expired_pending")
    out = {"live_tasks": live_tasks, "setup_seconds": round(setup, 1),
           "finished": finished, "unfinished": unfinished}
    plain.flushall()
    plain.close()
    return out


def _expire(conn: redis.Redis, config: Config, due: list[str], expect: str) -> dict[str, Any]:
    now = now_ms()
    pipe = conn.pipeline(transaction=False)
    for task_id in due:
        pipe.zadd(keys.EXPIRY, {task_id: now - 1000}, xx=True)
    pipe.execute()
    housekeeper = Housekeeper(conn, config)
    report = PassReport("expire")
    started = time.perf_counter()
    housekeeper.expire(report, now=now)
    seconds = time.perf_counter() - started
    touched = report.counts.get("due", 0)
    if touched != len(due) or report.counts.get(expect, 0) != len(due):
        raise AssertionError(f"expiry pass touched {report.counts}, expected {len(due)} {expect}")
    return {"seconds": round(seconds, 4), "touched": touched, "counts": report.counts}
