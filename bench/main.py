"""``make bench``: start the real stack, measure everything beside its baseline, print the table, write JSON.

Order (each phase starts from what it needs; the HTTP phases run while no worker exists, so the
workers neither steal CPU nor drain the submitted tasks):
  1. load generator ceiling (canned server), then hello / submit / batch submit, one-GET / status / batch status
     over HTTP;
  1b. the Celery 5 + Flower 2 peer with no worker running (submit, status, info), then alternating rounds of
      each Celery worker configuration and of taskport with their workers running: submit, status, batch
      submit and batch status (taskport), end to end with 2,000 and 20,000 tasks, and 20,000 as 20 batches;
  2. per worker class (simple = the default, fork, spawn): bare RQ and taskport throughput on no-op
     jobs with the same class and process count, then submit -> COMPLETED latency with idle workers;
  3. round trips in-process (counting connections) and INFO commandstats; the submit envelope's fast path
     against marshmallow's load (in-process CPU, bench/envelope.py);
  4. Redis memory per finished task over 10,000 tasks; 5. the housekeeping expiry pass; 6. ctx.each's
     per-item and orders.export's per-row overhead against bare loops (in-process, bench/overhead.py).
  (1c, after 1: status reads with 1,000 and with 1,000,000 finished tasks stored, bench/stored.py.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from bench import (
    before_after,
    checkpoint,
    cpu_report,
    envelope,
    fair_ab,
    measure_http,
    measure_peers,
    measure_redis,
    measure_watchers,
    measure_workers,
    output_live,
    overhead,
    ratelimit,
    read_tokens,
    report,
    stored,
)
from bench.machine import CpuWatch
from bench.process_cpu import least as least_cpu
from bench.stack import REPO, Stack

RESULTS = REPO / "bench" / "results"
RECORD = REPO / "bench" / "RESULTS.md"
WORKER_CLASSES = ("simple", "fork", "spawn")  # the default first
PARTS = ("http", "stored", "peers", "watchers", "trips", "workers", "memory", "housekeeping", "overhead", "limits",
         "output", "fair", "tokens", "before")
LATENCY_SAMPLES = {"fork": 200, "simple": 100, "spawn": 15}
T = TypeVar("T")


def phase(name: str, run: Callable[[], T], timings: dict[str, float]) -> T:
    print(f"bench: {name}...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    value = run()
    timings[name] = round(time.perf_counter() - started, 1)
    print(f"bench: {name} done in {timings[name]} s", file=sys.stderr, flush=True)
    return value


def workers_phase(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    processes = stack.config.workers
    found: dict[str, Any] = {}
    for cls in args.worker_classes:
        entry: dict[str, Any] = {"processes": processes}
        runs: dict[str, list[dict[str, Any]]] = {"bare_rq": [], "taskport": []}
        for _ in range(args.rounds if cls == report.DEFAULT_CLASS else 1):  # the others are for the record
            for name, bare in (("bare_rq", True), ("taskport", False)):
                result = measure_workers.throughput(stack, cls, processes, bare=bare, warmup=args.worker_warmup,
                                                    window=args.duration)
                runs[name].append(result.as_dict())
        for name, results in runs.items():
            entry[name] = dict(max(results, key=lambda r: float(r["jobs_per_s"])))
            entry[name]["rounds_jobs_per_s"] = [r["jobs_per_s"] for r in results]
            entry[name]["least_cpu_ms_per_op"] = least_cpu(results)
        workers = stack.start_workers(cls, processes)
        try:
            samples = max(10, int(LATENCY_SAMPLES[cls] * args.scale))
            entry["latency"] = measure_workers.submit_to_completed(stack, samples)
        finally:
            stack.stop(*workers)
        found[cls] = entry
    return found


def peers_phase(stack: Stack, args: argparse.Namespace, timings: dict[str, float], out: dict[str, Any]) -> None:
    """The Celery + Flower peer with no worker running, then alternating rounds of each Celery worker
    configuration and taskport with their workers running (submit, status, batches, end to end)."""
    out["celery"] = phase("Celery + Flower, no worker running: submit; then status and info of the finished tasks",
                          lambda: measure_peers.celery_isolated(stack, args.conns, args.warmup, args.duration,
                                                                args.rounds), timings)
    found = measure_peers.peer_rounds(stack, args.conns, args.warmup, args.duration, args.rounds, args.e2e_tasks,
                                      args.e2e_large_tasks, lambda name, run: phase(name, run, timings),
                                      out.setdefault("peer_rounds", {}))
    out["celery"]["pools"] = found["celery_pools"]
    out["celery"].update(found["celery_best"])  # e2e, e2e_large(_stored), submit/status/info_live: the best pool's
    ours = found["taskport"]
    for name in ("e2e", "e2e_large", "batch_e2e"):
        out[name] = ours.pop(name)
    out["live"] = ours
    if args.e2e_workers:
        out["e2e_by_workers"] = phase("taskport end to end per worker count", lambda: measure_peers.e2e_by_workers(
            stack, args.conns, args.e2e_tasks, args.e2e_workers, args.rounds), timings)


def measure(stack: Stack, args: argparse.Namespace, timings: dict[str, float],
            out: dict[str, Any]) -> dict[str, Any]:
    """Each part of ``args.only`` in turn, its figures into ``out`` (kept as far as it got should a part fail)."""
    only = set(args.only)
    if only & {"http", "stored", "workers"}:
        phase("start gunicorn", stack.start_web, timings)
    if "http" in only:
        out["loadgen_ceiling"] = phase("load generator ceiling", lambda: measure_http.loadgen_ceiling(
            stack, args.conns, min(args.warmup, 1.0), min(args.duration, 3.0)), timings)
        out["http"] = phase("HTTP: hello, submit, batch submit, one GET, status, batch status",
                            lambda: measure_http.http_phases(stack, args.conns, args.warmup, args.duration,
                                                             args.rounds), timings)
    if "stored" in only:
        out["stored"] = phase("status reads by how many finished tasks are stored", lambda: stored.
                              status_by_stored(stack, args.conns, args.warmup, args.duration, args.rounds,
                                               args.stored_tasks), timings)
    if "tokens" in only:
        out["tokens"] = phase("status reads with a read token vs with an API key", lambda: read_tokens.measure(
            stack, args.conns, args.warmup, args.duration, args.rounds), timings)
    if "peers" in only:
        peers_phase(stack, args, timings, out)
    if "watchers" in only:
        out["watchers"] = phase("live watchers beside status polls (gthread, gevent)", lambda: measure_watchers.
                                watchers_phase(stack, args.conns, args.warmup, args.duration,
                                               args.rounds, tuple(args.watchers)), timings)
        if "workers" in only:
            stack.start_web()
    if "workers" in only:
        out["workers"] = phase("workers: throughput and latency", lambda: workers_phase(stack, args), timings)
    own_process_parts(stack, only, args, timings, out)
    in_process_parts(stack, only, args, timings, out)
    return out


def own_process_parts(stack: Stack, only: set[str], args: argparse.Namespace, timings: dict[str, float],
                      out: dict[str, Any]) -> None:
    """The parts that start the processes they measure themselves: live output, before and after (issue 32)."""
    if "output" in only:
        out["output"] = phase("live output: 1,000 lines/s to an SSE watcher, bytes per line",
                              lambda: output_live.measure(stack), timings)
    if "before" in only:
        out["before_after"] = phase(f"before ({args.before}) and after: CPU per submit, status read and delivery",
                                    lambda: before_after.measure(stack, args.rounds, args.conns, min(args.warmup, 1.0),
                                                                 args.duration, args.before), timings)


def in_process_parts(stack: Stack, only: set[str], args: argparse.Namespace, timings: dict[str, float],
                     out: dict[str, Any]) -> None:
    """The parts measured in-process or on Redis alone (no HTTP): round trips, memory, housekeeping, overhead."""
    if "trips" in only:
        out["round_trips"] = phase("round trips (in-process)", lambda: measure_redis.round_trips(stack), timings)
        out["delivery_round_trips"] = phase("round trips per RQ delivery (in-process SimpleWorker)",
                                            lambda: measure_redis.worker_round_trips(stack), timings)
        out["envelope"] = phase("submit envelope: fast path vs SubmitSchema.load (in-process)", envelope.measure,
                                timings)
    if "memory" in only:
        out["memory"] = phase("memory per finished task", lambda: measure_redis.memory_per_task(
            stack, n=args.memory_tasks), timings)
        out["checkpoint"] = phase("checkpoint bytes per 10,000 items done", lambda: checkpoint.measure(
            stack.client(), stack.config), timings)
    if "housekeeping" in only:
        out["housekeeping"] = phase("housekeeping expiry pass", lambda: measure_redis.housekeeping(
            stack, live=args.live_tasks), timings)
    if "limits" in only:
        out["limits"] = phase("rate limits: accuracy on 4 workers, cost per ctx.limit call", lambda: ratelimit.measure(
            stack), timings)
    if "overhead" in only:
        out["overhead"] = phase("per-item and per-row overhead (in-process)", lambda: overhead.measure(
            items=args.overhead_items, rows=args.overhead_rows), timings)
    if "fair" in only:
        out["fair"] = phase("fair dispatch, one member alone: the fair claim and the FIFO claim before it", lambda:
                            fair_ab.measure(max(4, 2 * args.rounds), 2000 if args.scale == 1.0 else 500, stack=stack),
                            timings)


# Each part of the run's output that makes rows, and how (in the table's order).
ROW_MAKERS: list[tuple[str, Callable[[dict[str, Any]], list[report.Row]]]] = [
    ("before_after", lambda out: cpu_report.before_after_rows(out["before_after"])),
    ("e2e", lambda out: cpu_report.e2e_cpu_rows(out)),
    ("http", lambda out: [*report.http_rows(out["http"], out["loadgen_ceiling"]),
                          cpu_report.status_cpu_row(out["http"])]),
    ("stored", lambda out: report.stored_rows(out["stored"])),
    ("e2e", lambda out: report.peer_rows(out.get("http"), out["celery"], out)),
    ("e2e_by_workers", lambda out: report.e2e_worker_rows(out["e2e_by_workers"], out["celery"]["e2e"])),
    ("watchers", lambda out: report.watcher_rows(out["watchers"])),
    ("workers", lambda out: report.worker_rows(out["workers"])),
    ("round_trips", lambda out: [*report.trips_rows(out["round_trips"], out["delivery_round_trips"]),
                                 cpu_report.commands_row(out["delivery_round_trips"])]),
    ("envelope", lambda out: report.envelope_rows(out["envelope"])),
    ("memory", lambda out: report.memory_rows(out["memory"])),
    ("checkpoint", lambda out: report.checkpoint_rows(out["checkpoint"])),
    ("housekeeping", lambda out: report.housekeeping_rows(out["housekeeping"])),
    ("overhead", lambda out: overhead.rows(out["overhead"])),
    ("output", lambda out: output_live.rows(out["output"])),
    ("limits", lambda out: ratelimit.rows(out["limits"])),
    ("fair", lambda out: fair_ab.rows(out["fair"])),
    ("tokens", lambda out: read_tokens.rows(out["tokens"])),
]


def table(out: dict[str, Any]) -> list[report.Row]:
    return [row for part, make in ROW_MAKERS if part in out for row in make(out)]


def environment(stack: Stack, args: argparse.Namespace) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=False).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "app", "workers"], cwd=REPO, capture_output=True,
                                text=True, check=False).stdout.strip())
    c = stack.config
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "commit": commit + ("+dirty" if dirty else ""),
            "python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
            "gunicorn_workers": c.web_concurrency, "gunicorn_worker_class": c.web_worker_class,
            "gunicorn_threads": c.web_threads, "gunicorn_connections": c.web_connections, "rq_workers": c.workers,
            "conns": args.conns, "warmup_s": args.warmup, "duration_s": args.duration,
            "workers_during_http": "none running (started only after the HTTP phases)",
            "workers_during_live_rows": f"{c.workers} {c.worker_class} taskport workers; one Celery worker per pool",
            "e2e_tasks": args.e2e_tasks, "e2e_large_tasks": args.e2e_large_tasks}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="taskport benchmarks (see bench/README.md)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement window")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of HTTP warm-up before each window")
    parser.add_argument("--worker-warmup", type=float, default=1.0, help="seconds skipped after the first job")
    parser.add_argument("--rounds", type=int, default=2,
                        help="alternating rounds of each target pair (HTTP, default-class workers); the best counts")
    parser.add_argument("--conns", type=int, default=16, help="load generator connections (= 2 workers x 8 threads)")
    parser.add_argument("--watchers", type=int, nargs="+", default=list(measure_watchers.COUNTS),
                        help="live SSE watcher counts of the watchers rows (gevent); the first is the baseline")
    parser.add_argument("--e2e-tasks", type=int, default=2000, help="tasks of the end-to-end runs")
    parser.add_argument("--e2e-large-tasks", type=int, default=20_000,
                        help="tasks of the larger end-to-end runs (single submits, and batches of 1,000)")
    parser.add_argument("--e2e-workers", type=int, nargs="*", default=[],
                        help="with peers: also run taskport's end to end with each of these worker counts "
                             "(alternating, --rounds rounds, the best counts), to choose TASKPORT_WORKERS")
    parser.add_argument("--memory-tasks", type=int, default=10_000)
    parser.add_argument("--live-tasks", type=int, default=100_000)
    parser.add_argument("--stored-tasks", type=int, default=stored.LARGE,
                        help="finished tasks stored for the second status-by-stored row (the first has 1,000)")
    parser.add_argument("--overhead-items", type=int, default=100_000, help="items of the per-item overhead row")
    parser.add_argument("--overhead-rows", type=int, default=200_000, help="rows of the per-row overhead rows")
    parser.add_argument("--worker-classes", nargs="+", default=list(WORKER_CLASSES), choices=WORKER_CLASSES)
    parser.add_argument("--before", default=before_after.BEFORE,
                        help="the commit the before part measures beside this checkout (issue 32's base)")
    parser.add_argument("--only", nargs="+", default=list(PARTS), choices=PARTS,
                        help="measure only these parts (to iterate on one; the default is all of them)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: short windows, fewer tasks")
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs of every process)")
    parser.add_argument("--record", action="store_true", help=f"also write {RECORD.name} (the committed copy)")
    parser.add_argument("--output", type=Path, default=RESULTS / "latest.json")
    args = parser.parse_args(argv)
    args.scale = 1.0
    if args.quick:
        args.duration, args.warmup, args.worker_warmup, args.scale, args.rounds = 1.0, 0.5, 0.5, 0.2, 1
        args.memory_tasks, args.live_tasks, args.e2e_large_tasks = 1000, 10_000, 4000
        args.stored_tasks, args.overhead_items, args.overhead_rows = 100_000, 10_000, 20_000
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    watch = CpuWatch().start()
    with Stack(keep=args.keep) as stack:
        if args.keep:
            print(f"bench: logs in {stack.dir}", file=sys.stderr)
        out: dict[str, Any] = {}
        try:
            measure(stack, args, timings, out)
        except BaseException:
            args.output.parent.mkdir(parents=True, exist_ok=True)
            args.output.write_text(json.dumps({"partial": True, "timings_s": timings, "raw": out}, indent=2) + "\n")
            print(f"bench: failed; the figures measured so far are in {args.output}", file=sys.stderr)
            raise
        meta = environment(stack, args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"meta": meta, "timings_s": timings, "raw": out}, indent=2) + "\n")  # kept
    # should a row maker fail: a full run's figures are not lost (rewritten whole below)
    rows = table(out)
    meta["total_seconds"] = round(time.perf_counter() - started, 1)
    meta["cpu"] = cpu = watch.report()
    text = report.markdown(rows)
    print(text)
    failed = [r.measure for r in rows if r.verdict == "FAIL"]
    print(f"\n{sum(r.verdict == 'PASS' for r in rows)} targets pass, {len(failed)} fail; "
          f"{meta['total_seconds']} s in all ({meta['commit']}, {meta['cpus']} CPUs); other processes used "
          f"{cpu['other_share_of_machine']:.0%} of the machine meanwhile")
    if cpu["other_share_of_machine"] > 0.1:
        print("WARNING: the machine was busy with other work: figures are skewed; run again on a quiet machine")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"meta": meta, "timings_s": timings, "rows": report.rows_json(rows),
                                       "table_markdown": text, "raw": out}, indent=2) + "\n")
    print(f"bench: wrote {args.output}", file=sys.stderr)
    if args.record:
        RECORD.write_text(report.results_markdown(meta, text, out, cpu_report.headline(out)))
        print(f"bench: wrote {RECORD}", file=sys.stderr)
    return 0
