"""run_at lateness: 10,000 tasks due within the same minute, queued by real scheduler processes.

    .venv/bin/python -m bench.delayed [--tasks 10000] [--window 60] [--schedulers 1]

A redis-server of its own (tests/integration/harness.py) and ``--schedulers`` scheduler processes started as
production starts them; the tasks are created straight through the store (TaskStore.create with run_at,
one script each: what a submit does, without the HTTP), their run_at spread evenly over ``--window``
seconds starting once all exist. No worker runs: what is measured is the promotion, the lateness of each
task's queueing, ``enqueued_at`` of its RQ job (RQ's clock, µs) minus its run_at; a worker's start adds
its own queue wait on top, which is the worker bench's business. Prints p50/p99/max lateness, and the
Redis bytes of a task waiting for its time and of a task waiting for another (MEMORY USAGE of its keys,
its share of the sorted set or dependents set).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import redis

from app.core import keys, processors
from app.core.answers import NewTask
from app.core.clock import now_ms
from app.core.jobs import JobQueue
from app.core.store import TaskStore
from tests.integration.harness import RedisServer, Stack, wait_until


def new_task(member: str = "bench") -> NewTask:
    task_id = str(uuid.uuid4())
    return NewTask(task_id, member, "demo.sleep", {"seconds": 0}, task_id, "default", 1)


def fill(store: TaskStore, n: int, window_s: float, lead_s: float) -> tuple[list[tuple[str, int]], int]:
    """Create ``n`` delayed tasks due evenly over ``window_s`` from ``lead_s`` ahead: (id, run_at) each."""
    start = now_ms() + int(lead_s * 1000)
    tasks = []
    for i in range(n):
        new = new_task()
        run_at = start + int(i * window_s * 1000 / n)
        store.create(new, run_at=run_at)
        tasks.append((new.task_id, run_at))
    return tasks, start


def lateness_ms(conn: redis.Redis, tasks: list[tuple[str, int]]) -> list[float]:
    pipe = conn.pipeline(transaction=False)
    for task_id, _ in tasks:
        pipe.hget(f"rq:job:{task_id}", "enqueued_at")
    late = []
    for (_, run_at), raw in zip(tasks, pipe.execute(), strict=True):
        queued = datetime.fromisoformat(raw.decode().replace("Z", "+00:00")).timestamp() * 1000
        late.append(queued - run_at)
    return late


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def waiting_bytes(conn: redis.Redis, store: TaskStore, jobs: JobQueue) -> dict[str, int]:
    """MEMORY USAGE of a task waiting for its run_at and of one waiting for another task, with their set
    entries (the sorted set's and the dependents set's growth per member, measured over 1,000)."""
    usage: Any = conn.memory_usage
    conn.flushall()
    one = new_task()
    store.create(one, run_at=now_ms() + 3_600_000)
    delayed = (usage(keys.task(one.task_id)) or 0) + (usage(keys.payload(one.task_id)) or 0)
    base = usage(keys.DELAYED) or 0
    for _ in range(999):
        store.create(new_task(), run_at=now_ms() + 3_600_000)
    entry = ((usage(keys.DELAYED, samples=0) or 0) - base) // 999
    dep = new_task()
    store.create(dep, jobs.job_commands(dep.task_id, "default", 60))
    waiter = new_task()
    store.create(waiter, after=[dep.task_id])
    after = (usage(keys.task(waiter.task_id)) or 0) + (usage(keys.payload(waiter.task_id)) or 0)
    return {"delayed_task": delayed, "delayed_set_entry": entry, "after_task": after,
            "dependents_set": usage(keys.dependents(dep.task_id)) or 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--window", type=float, default=60.0, help="seconds the run_at times are spread over")
    parser.add_argument("--schedulers", type=int, default=1)
    args = parser.parse_args(argv)
    processors.load()
    with tempfile.TemporaryDirectory(prefix="bench-delayed-") as tmp:
        server = RedisServer(Path(tmp) / "redis").start()
        stack = Stack(server.url, Path(tmp) / "stack")
        try:
            conn = server.client()
            store, jobs = TaskStore(conn, stack.config), JobQueue(conn, stack.config)
            for _ in range(args.schedulers):
                stack.start_scheduler()
            made = time.perf_counter()
            lead = 5 + args.tasks / 2000  # the fill must end before the first is due
            tasks, start = fill(store, args.tasks, args.window, lead)
            print(f"{args.tasks:,} tasks created in {time.perf_counter() - made:.1f} s, due over {args.window:.0f} s "
                  f"from {max(0.0, (start - now_ms()) / 1000):.1f} s ahead; {args.schedulers} scheduler(s)")
            wait_until(lambda: now_ms() > tasks[-1][1] and conn.zcard(keys.DELAYED) == 0,
                       timeout=lead + args.window + 30, interval=0.5, message="every task to be queued")
            late = lateness_ms(conn, tasks)
            print(f"lateness (RQ enqueued_at - run_at): p50 {percentile(late, 50):.0f} ms, "
                  f"p99 {percentile(late, 99):.0f} ms, max {max(late):.0f} ms, mean {statistics.mean(late):.0f} ms; "
                  f"queued {len(late):,} of {args.tasks:,}, {sum(1 for v in late if v > 1000)} later than 1 s")
            sizes = waiting_bytes(conn, store, jobs)
            print("bytes: " + ", ".join(f"{k} {v}" for k, v in sizes.items()))
        finally:
            stack.teardown()
            server.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
