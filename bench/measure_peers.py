"""The Celery 5 + Flower 2 peer beside taskport: submit and status over Flower's REST API, and the end-to-end
run (``bench.e2e``: N no-op tasks over HTTP from C clients, polled until done) for both.

Same machine, same embedded redis-server (flushed between the sides), same load generator and e2e
client. Celery runs with its defaults (prefork, one child per CPU: 2 here), Flower with its REST API
open. taskport runs with its defaults: the bench app on ``taskport web``'s gunicorn argv and
``TASKPORT_WORKERS`` workers of the default class (what ``taskport up`` starts).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

import redis

from bench.measure_http import best, loadgen
from bench.stack import REPO, Stack


def e2e(stack: Stack, port: int, peer: str, tasks: int, conns: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "bench.e2e", "--port", str(port), "--peer", peer, "--tasks", str(tasks),
            "--conns", str(conns)]
    done = subprocess.run(argv, cwd=REPO, env=stack.environ(), capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0:
        raise RuntimeError(f"e2e {peer} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def celery_ids(conn: redis.Redis, limit: int = 20_000) -> list[str]:
    """Ids of the tasks the Celery backend knows (its result keys)."""
    prefix = b"celery-task-meta-"
    found = []
    for key in conn.scan_iter(match=prefix + b"*", count=1000):
        found.append(key[len(prefix):].decode())
        if len(found) >= limit:
            break
    return found


def wait_drained(conn: redis.Redis, timeout: float = 120.0) -> None:
    """Until Celery's queue (the ``celery`` list) is empty."""
    deadline = time.monotonic() + timeout
    while conn.llen("celery"):
        if time.monotonic() > deadline:
            raise RuntimeError("the Celery worker did not drain its queue")
        time.sleep(0.2)


def celery_phase(stack: Stack, conns: int, warmup: float, duration: float, rounds: int, tasks: int) -> dict[str, Any]:
    conn = stack.client()
    conn.flushall()
    env = stack.environ()
    flower, port = stack.start_flower()
    out: dict[str, Any] = {}
    try:
        # submit with no worker running (as taskport's submit rows), then run them all, then read results
        out["submit"] = best([loadgen(port, "flower-submit", conns=conns, warmup=warmup if i == 0 else min(warmup, 1.0),
                                      duration=duration, base=i * 10_000_000, env=env) for i in range(rounds)])
        worker = stack.start_celery_worker()
        wait_drained(conn)
        ids_file = stack.dir / "celery-ids.txt"
        ids = celery_ids(conn)
        ids_file.write_text("\n".join(ids))
        out["status"] = best([loadgen(port, "flower-status", conns=conns, warmup=min(warmup, 1.0), duration=duration,
                                      ids_file=str(ids_file), env=env) for _ in range(rounds)])
        out["status"]["distinct_tasks_read"] = len(ids)
        conn.flushall()
        out["e2e"] = e2e(stack, port, "celery", tasks, conns)
        stack.stop(worker)
    finally:
        stack.stop(flower)
        conn.flushall()
        conn.close()
    return out


def celery_e2e(stack: Stack, conns: int, tasks: int) -> dict[str, Any]:
    """One more end-to-end run of Celery + Flower (fresh processes, Redis flushed before and after)."""
    conn = stack.client()
    conn.flushall()
    flower, port = stack.start_flower()
    try:
        worker = stack.start_celery_worker()
        try:
            return e2e(stack, port, "celery", tasks, conns)
        finally:
            stack.stop(worker)
    finally:
        stack.stop(flower)
        conn.flushall()
        conn.close()


def best_e2e(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of alternating end-to-end rounds (see "Rounds" in bench/README.md), with every round's figure."""
    return {**max(runs, key=lambda r: float(r["tasks_per_s"])), "rounds": [r["tasks_per_s"] for r in runs]}


def taskport_e2e(stack: Stack, conns: int, tasks: int) -> dict[str, Any]:
    conn = stack.client()
    conn.flushall()
    stack.start_web()
    workers = stack.start_workers(stack.config.worker_class, stack.config.workers)
    try:
        result = e2e(stack, stack.config.port, "taskport", tasks, conns)
        result["worker_class"] = stack.config.worker_class
        result["workers"] = stack.config.workers
    finally:
        stack.stop(*workers)
        conn.flushall()
        conn.close()
    return result


def e2e_by_workers(stack: Stack, conns: int, tasks: int, counts: list[int], rounds: int) -> dict[str, Any]:
    """taskport's end to end with each worker count, alternating over ``rounds`` rounds (the best counts)."""
    base = stack.config
    runs: dict[str, list[dict[str, Any]]] = {str(n): [] for n in counts}
    try:
        for _ in range(rounds):
            for n in counts:
                stack.config = replace(base, workers=n)
                runs[str(n)].append(taskport_e2e(stack, conns, tasks))
    finally:
        stack.config = base
    return {n: best_e2e(found) for n, found in runs.items()}
