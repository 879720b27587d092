"""The client side of bench/scale.py: runs on the bed's ``client`` host, one JSON line on stdout.

    python -m bench.scale_client wait --hosts 10.231.0.31,10.231.0.32 --workers 4
    python -m bench.scale_client e2e  --hosts 10.231.0.31 --tasks 2000 --conns 16 [--seconds 0.1]
    python -m bench.scale_client load --hosts 10.231.0.31,10.231.0.32 --kind submit --conns 16 --duration 4

``e2e`` is bench/e2e.py's client (each connection submits the next number of a shared counter until N are
in, then polls its own tasks until done) with the connections dealt round-robin over the web hosts, as a
load balancer would; ``load`` is bench/loadgen.py's closed loop (its ``Run``/``Client`` protocol, requests
pre-built as bytes) the same way. Both report the CPU this process used, so the caller can count the
client host's share. The web hosts answer in open mode (``TASKPORT_ALLOWED_HOSTS`` names them all), so
one Host header serves every connection.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench import e2e, loadgen

READY_TIMEOUT = 60.0
# bench/e2e.py's no-op body with the task's length as a parameter (0 = the no-op of every other row)
SLEEP_BODY = '{"type":"demo.sleep","payload":{"seconds":%s,"steps":1,"fail_items":[%%d]}}'


def ready(url: str, workers: int) -> bool:
    """/readyz answers 200 and at least ``workers`` workers listen on the default queue."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2.0) as answer:
            doc = json.loads(answer.read())
    except (OSError, ValueError):
        return False
    return doc.get("status") == "ready" and int(doc.get("workers", {}).get("default", 0)) >= workers


def wait(hosts: list[str], port: int, workers: int) -> dict[str, Any]:
    """Every web host ready with ``workers`` workers listening; the seconds it took."""
    began = time.monotonic()
    for host in hosts:
        while not ready(f"http://{host}:{port}", workers):
            if time.monotonic() - began > READY_TIMEOUT:
                raise SystemExit(f"{host}:{port}/readyz not ready with {workers} workers in {READY_TIMEOUT} s")
            time.sleep(0.1)
    return {"ready_s": round(time.monotonic() - began, 2)}


async def end_to_end(hosts: list[str], port: int, total: int, conns: int, seconds: float,
                     timeout: float) -> dict[str, Any]:
    """bench.e2e's clients over several web hosts; tasks/s = N / (first submit -> last task seen done)."""
    peer = dataclasses.replace(e2e.PEERS["taskport"], body=SLEEP_BODY % seconds)
    stats: dict[str, Any] = {"done": 0, "polls": 0, "errors": [], "submitted_at": 0.0, "last_done": 0.0}
    counter = itertools.count()
    started = time.perf_counter()
    base = e2e.payload_base()
    clients = (e2e.client(hosts[i % len(hosts)], port, peer, counter, total, base, stats) for i in range(conns))
    try:
        await asyncio.wait_for(asyncio.gather(*clients), timeout)
        timed_out = False
    except TimeoutError:
        timed_out = True
    elapsed = (time.perf_counter() if timed_out else stats["last_done"]) - started
    return {"tasks": total, "done": stats["done"], "timed_out": timed_out, "seconds": round(elapsed, 3),
            "tasks_per_s": round(stats["done"] / elapsed, 1) if elapsed > 0 else 0.0,
            "submit_seconds": round(stats["submitted_at"] - started, 3), "polls": stats["polls"],
            "errors": stats["errors"][:10], "error_count": len(stats["errors"]), "task_seconds": seconds}


async def closed_loop(hosts: list[str], port: int, kind: str, conns: int, warmup: float, duration: float,
                      ids: list[str], base: int) -> dict[str, Any]:
    """bench.loadgen's ``drive`` with its connections dealt over several web hosts."""
    t0 = time.perf_counter()
    run = loadgen.Run(loadgen.request_factory(kind, f"{hosts[0]}:{port}", ids, base), t0 + warmup,
                      t0 + warmup + duration)
    loop = asyncio.get_running_loop()
    for i in range(conns):
        await loop.create_connection(lambda: loadgen.Client(run), hosts[i % len(hosts)], port)
    await asyncio.sleep(max(0.0, run.start - time.perf_counter()))
    cpu0 = loadgen.cpu_seconds()
    await asyncio.wait_for(run.done, timeout=warmup + duration + 30)
    measured = min(time.perf_counter(), run.end) - run.start
    return loadgen.summarize(run, kind, measured, loadgen.cpu_seconds() - cpu0, loadgen.cpu_seconds())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale_client", description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("wait", "e2e", "load"))
    parser.add_argument("--hosts", required=True, help="comma list of the web hosts' IPs")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=1, help="wait: workers that must listen")
    parser.add_argument("--tasks", type=int, default=2000, help="e2e: tasks to submit")
    parser.add_argument("--seconds", type=float, default=0.0, help="e2e: each task's demo.sleep seconds")
    parser.add_argument("--timeout", type=float, default=180.0, help="e2e: give up after this many seconds")
    parser.add_argument("--kind", choices=("submit", "status"), default="submit", help="load: what to send")
    parser.add_argument("--conns", type=int, default=16)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--ids", type=Path, help="load --kind status: file with one task id a line")
    parser.add_argument("--base", type=int, default=0, help="load: first number in the unique submit payloads")
    args = parser.parse_args(argv)
    hosts = args.hosts.split(",")
    if args.mode == "wait":
        result = wait(hosts, args.port, args.workers)
    elif args.mode == "e2e":
        result = asyncio.run(end_to_end(hosts, args.port, args.tasks, args.conns, args.seconds, args.timeout))
    else:
        ids = args.ids.read_text().split() if args.ids else []
        result = asyncio.run(closed_loop(hosts, args.port, args.kind, args.conns, args.warmup, args.duration, ids,
                                         args.base))
    result["client_cpu_s"] = round(loadgen.cpu_seconds(), 3)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
