"""Worker throughput (taskport vs bare RQ, same worker class and process count) and submit -> COMPLETED latency.

Throughput: the queue is filled first (taskport: tasks created and queued through the product's
``TaskStore.create`` with ``JobQueue.job_commands``; bare RQ: ``enqueue_many`` of ``bench.noop.noop`` with RQ's
defaults), then the workers start. Completions are sampled every ``POLL`` seconds with one command
(taskport: the ``completed`` counter that the COMPLETED transition bumps in the same script, so it
counts tasks whose COMPLETED status is visible; bare RQ: the finished-job registry). The first
``warmup`` seconds after the first completion are skipped; the rate is completions over ``window``.
"""

from __future__ import annotations

import http.client
import json
import time
from dataclasses import dataclass
from typing import Any

import redis
from rq import Queue
from rq.registry import FinishedJobRegistry

from app.core import keys
from bench.counting import command_delta, commandstats, per_op
from bench.fill import create_tasks, enqueue_noops
from bench.loadgen import percentile
from bench.process_cpu import per_op as cpu_per_op
from bench.process_cpu import snapshot
from bench.stack import Stack

POLL = 0.05
# Expected jobs/s per worker process, generously high, to size the pre-filled queue (it must not run dry).
FILL_RATE = {"fork": 300, "simple": 1200, "spawn": 60}


@dataclass
class Throughput:
    rate: float
    completed: int
    seconds: float
    commands_per_task: dict[str, float]
    ran_dry: bool
    cpu_ms_per_op: dict[str, float]  # per delivery: the workers' (work horses included) and Redis's

    def as_dict(self) -> dict[str, Any]:
        return {"jobs_per_s": round(self.rate, 1), "completed_in_window": self.completed,
                "seconds": round(self.seconds, 3), "ran_dry": self.ran_dry,
                "commands_per_task": self.commands_per_task,
                "commands_per_task_total": round(sum(self.commands_per_task.values()), 2),
                "cpu_ms_per_op": self.cpu_ms_per_op}


def _counter(conn: redis.Redis, bare: bool) -> Any:
    if bare:
        key = FinishedJobRegistry(queue=Queue("default", connection=conn)).key
        return lambda: int(conn.zcard(key))
    return lambda: int(conn.hget(keys.STATS, "completed") or 0)


def throughput(stack: Stack, worker_class: str, processes: int, *, bare: bool, warmup: float,
               window: float) -> Throughput:
    conn = stack.client()
    conn.flushall()
    fill = FILL_RATE[worker_class] * processes * int(warmup + window + 3)
    if bare:
        enqueue_noops(conn, fill)
    else:
        create_tasks(conn, stack.config, fill, enqueue=True)
    count = _counter(conn, bare)
    workers = stack.start_workers(worker_class, processes, bare=bare)
    try:
        deadline = time.monotonic() + 60
        while count() == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no job completed within 60 s:\n{workers[0].tail()}")
            time.sleep(POLL / 5)
        time.sleep(warmup)
        groups = stack.cpu_groups(workers=workers)
        cpu0 = snapshot(groups)
        before, c0, t0 = commandstats(conn), count(), time.perf_counter()
        polls, c1, t1 = _sample_until(count, t0 + window, fill)
        after = commandstats(conn)
        cpu1 = snapshot(groups)
    finally:
        conn.delete(*(Queue(q, connection=conn).key for q in ("high", "default", "low")))  # drain what is left
        stack.stop(*workers)
    delta = command_delta(before, after)
    own = "zcard" if bare else "hget"
    delta[own] = delta.get(own, 0) - polls  # the sampling commands are ours, not the workers'
    done = c1 - c0
    return Throughput(done / (t1 - t0), done, t1 - t0, per_op({k: v for k, v in delta.items() if v > 0}, max(done, 1)),
                      ran_dry=c1 >= fill, cpu_ms_per_op=cpu_per_op({k: cpu1[k] - cpu0[k] for k in cpu0}, done))


def _sample_until(count: Any, end: float, fill: int) -> tuple[int, int, float]:
    """Poll until ``end`` (or until every filled job is done); (polls made, last count, its time)."""
    polls = 0
    while True:
        time.sleep(POLL)
        value, now = count(), time.perf_counter()
        polls += 1
        if now >= end or value >= fill:
            return polls, value, now


def submit_to_completed(stack: Stack, samples: int, warmup: int = 5, gap: float = 0.02) -> dict[str, Any]:
    """Submit over HTTP (one keep-alive connection), then wait for COMPLETED: the bench is subscribed
    (PSUBSCRIBE ``app.core.keys.events("*")``, before any submit) to every task's event channel, and reads
    the task's status after each event of that task. One sample at a time, ``gap`` seconds apart, so a
    worker is idle when the task arrives. Latency = POST sent -> COMPLETED read."""
    conn = stack.client()
    pubsub = conn.pubsub(ignore_subscribe_messages=True)
    pubsub.psubscribe(keys.events("*"))
    pubsub.get_message(timeout=1.0)  # the subscription is confirmed before the first submit
    http_conn = http.client.HTTPConnection("127.0.0.1", stack.config.port, timeout=30)
    latencies = []
    try:
        for i in range(samples + warmup):
            body = json.dumps({"type": "demo.sleep", "payload": {"seconds": 0, "steps": 1,
                                                                  "fail_items": [10_000_000 + i]}})
            latency = _one_submit(conn, pubsub, http_conn, body)
            if i >= warmup:
                latencies.append(latency)
            time.sleep(gap)  # the worker finishes its own bookkeeping and is idle again
    finally:
        http_conn.close()
        pubsub.close()
        conn.close()
    latencies.sort()
    return {"samples": len(latencies), "p50_ms": round(percentile(latencies, 50) * 1000, 2),
            "p99_ms": round(percentile(latencies, 99) * 1000, 2), "max_ms": round(latencies[-1] * 1000, 2)}


def _one_submit(conn: redis.Redis, pubsub: Any, http_conn: http.client.HTTPConnection, body: str) -> float:
    started = time.perf_counter()
    http_conn.request("POST", "/api/v1/tasks", body, {"Content-Type": "application/json"})
    response = http_conn.getresponse()
    answer = json.loads(response.read())
    if response.status != 202:
        raise RuntimeError(f"submit answered {response.status}: {answer}")
    task_id = answer["task_id"]
    channel = keys.events(task_id).encode()
    while conn.hget(keys.task(task_id), "status") != b"COMPLETED":
        while True:
            if time.perf_counter() - started > 30:
                raise RuntimeError(f"task {task_id} not COMPLETED within 30 s")
            message = pubsub.get_message(timeout=1.0)
            if message is not None and message["channel"] == channel:
                break  # an event of this task: read its status again
    return time.perf_counter() - started
