"""The Celery 5 + Flower 2 peer beside taskport: submit and status over Flower's REST API, and the end-to-end
runs (``bench.e2e``: N no-op tasks over HTTP from C clients, until done) for both; taskport's batch rows with
its workers running.

Same machine, same embedded redis-server (flushed between the sides), same load generator and e2e client.
The peer at its best (issue 23): Celery's worker runs in each of ``bench.stack.CELERY_POOLS`` (prefork, its
default, and ``-P threads -c 8``; events on), Flower with its REST API open, and the faster configuration is
the peer of each ratio. taskport runs with its defaults: the bench app on ``taskport web``'s gunicorn argv and
``TASKPORT_WORKERS`` workers of the default class (what ``taskport up`` starts).

Two conditions: *isolated* (submit with no worker running, then reads of the finished tasks; kept for the
record) and *live* (the workers running as under ``taskport up``: they consume what the submit window
submits; the reads follow once they have drained it, workers still running). The rounds alternate between the
sides (each Celery configuration, then taskport, each on fresh processes) and the best round of each side counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from datetime import datetime
from functools import partial
from typing import Any

import redis
import requests

from app.core import keys
from bench.measure_http import (
    BATCH_BASE,
    BATCH_CONNS,
    BATCH_SIZE,
    batch_window,
    best,
    best_batches,
    history_ids,
    loadgen,
    status_batches,
)
from bench.process_cpu import least as least_cpu
from bench.process_cpu import measured, per_op, with_cpu
from bench.stack import CELERY_POOLS, REPO, Stack

CELERY_META = b"celery-task-meta-"  # the Celery result backend's key prefix (one key per task)
# How the Celery side's end-to-end clients poll: Flower's task info (its memory) answered the same tasks
# faster than its task result (the backend) in every round measured (bench/README.md), so the peer polls so.
CELERY_E2E_PEER = "celery-info"
DRAIN_TIMEOUT = 300.0  # seconds a backlog may take to drain before the bench gives up


def e2e_timeout(tasks: int) -> float:
    """The e2e client's own limit for ``tasks``: generous (a busy machine), but a stuck run still ends."""
    return max(120.0, 60.0 + tasks * 0.025)


def e2e(stack: Stack, port: int, peer: str, tasks: int, conns: int, groups: dict[str, list[int]],
        batch: int = 0) -> dict[str, Any]:
    """One ``bench.e2e`` run, with the CPU per task done of each process in ``groups`` over the whole run."""
    limit = e2e_timeout(tasks)
    argv = [sys.executable, "-m", "bench.e2e", "--port", str(port), "--peer", peer, "--tasks", str(tasks),
            "--conns", str(conns), "--timeout", str(limit), "--batch", str(batch)]
    done, seconds = measured(groups, lambda: subprocess.run(argv, cwd=REPO, env=stack.environ(), capture_output=True,
                                                             text=True, timeout=limit + 60, check=False))
    if done.returncode != 0:
        raise RuntimeError(f"e2e {peer} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["cpu_ms_per_op"] = per_op(seconds, int(result["done"]))
    return result


def requests_sent(found: dict[str, Any]) -> int:
    """A loadgen window's operations for its CPU per operation: every request sent, warm-up included (the CPU
    snapshots bracket the whole run)."""
    return int(found["submitted_total"])


def celery_ids(conn: redis.Redis, limit: int = 20_000) -> list[str]:
    """Ids of the tasks the Celery backend knows (its result keys)."""
    found = []
    for key in conn.scan_iter(match=CELERY_META + b"*", count=1000):
        found.append(key[len(CELERY_META):].decode())
        if len(found) >= limit:
            break
    return found


def celery_completed(conn: redis.Redis) -> tuple[int, float]:
    """How many tasks the Celery backend holds as SUCCESS, and the latest ``date_done`` among them (seconds
    since the epoch): read once a run is over, so the reading costs the run nothing."""
    keys_found = list(conn.scan_iter(match=CELERY_META + b"*", count=1000))
    succeeded, last = 0, 0.0
    for at in range(0, len(keys_found), 1000):
        for raw in conn.mget(keys_found[at:at + 1000]):
            meta = json.loads(raw) if raw else {}
            if meta.get("status") == "SUCCESS" and meta.get("date_done"):
                succeeded += 1
                last = max(last, datetime.fromisoformat(meta["date_done"]).timestamp())
    return succeeded, last


def _until(done: Any, what: str, timeout: float = DRAIN_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up waiting for {what} after {timeout:.0f} s")
        time.sleep(0.1)


def wait_drained(conn: redis.Redis, timeout: float = DRAIN_TIMEOUT) -> None:
    """Until Celery's queue (the ``celery`` list) is empty and no message is held unacknowledged by a worker."""
    _until(lambda: not conn.llen("celery") and not conn.hlen("unacked"), "the Celery worker to drain its queue",
           timeout)


def wait_flower_knows(port: int, ids: list[str], timeout: float = 60.0) -> None:
    """Until Flower's in-memory state (fed by the worker's events) answers for a sample of ``ids`` as SUCCESS:
    its ``/api/task/info`` answers 404 for a task it has not heard of."""
    sample = ids[:: max(1, len(ids) // 20)] + ids[-1:]

    def known() -> bool:
        for task_id in sample:
            answer = requests.get(f"http://127.0.0.1:{port}/api/task/info/{task_id}", timeout=5)
            if answer.status_code != 200 or answer.json().get("state") != "SUCCESS":
                return False
        return True

    _until(known, "Flower to hear of the finished tasks", timeout)


def taskport_drained(conn: redis.Redis, timeout: float = DRAIN_TIMEOUT) -> None:
    """Until the member has no unfinished task (the active-task count the scripts keep)."""
    _until(lambda: int(conn.hget(keys.ACTIVE, "public") or 0) == 0, "taskport's workers to drain", timeout)


def _reads(stack: Stack, port: int, kinds: tuple[str, ...], ids: list[str], conns: int, warmup: float,
           duration: float, groups: dict[str, list[int]]) -> dict[str, dict[str, Any]]:
    ids_file = stack.dir / "read-ids.txt"
    ids_file.write_text("\n".join(ids))
    found = {}
    for kind in kinds:
        found[kind] = with_cpu(groups, partial(loadgen, port, kind, conns=conns, warmup=warmup, duration=duration,
                                               ids_file=str(ids_file), env=stack.environ()), requests_sent)
        found[kind]["distinct_tasks_read"] = len(ids)
    return found


def celery_isolated(stack: Stack, conns: int, warmup: float, duration: float, rounds: int) -> dict[str, Any]:
    """Flower's submit with no worker running (as taskport's isolated submit rows), then the worker (prefork)
    runs them all, then reads of the finished tasks: results (backend) and info (Flower's memory)."""
    conn = stack.client()
    conn.flushall()
    env = stack.environ()
    flower, port = stack.start_flower()
    out: dict[str, Any] = {}
    try:
        out["submit"] = best([with_cpu(stack.cpu_groups(flower=flower), partial(
            loadgen, port, "flower-submit", conns=conns, warmup=warmup if i == 0 else min(warmup, 1.0),
            duration=duration, base=i * 10_000_000, env=env), requests_sent) for i in range(rounds)])
        worker = stack.start_celery_worker()
        groups = stack.cpu_groups(flower=flower, worker=worker)
        out["delivery"] = celery_drain(conn, groups)
        ids = celery_ids(conn)
        wait_flower_knows(port, ids)
        reads = [_reads(stack, port, ("flower-status", "flower-info"), ids, conns, min(warmup, 1.0), duration, groups)
                 for _ in range(rounds)]
        out["status"] = best([r["flower-status"] for r in reads])
        out["info"] = best([r["flower-info"] for r in reads])
        stack.stop(worker)
    finally:
        stack.stop(flower)
        conn.flushall()
        conn.close()
    return out


def celery_drain(conn: redis.Redis, groups: dict[str, list[int]]) -> dict[str, Any]:
    """The CPU per delivery of the Celery worker just started on a filled queue: from now until it has drained
    what is left (queued or unacknowledged now; the few it took before are not counted, nor their CPU)."""
    left = int(conn.llen("celery")) + int(conn.hlen("unacked"))
    _, seconds = measured(groups, lambda: wait_drained(conn))
    return {"tasks": left, "cpu_ms_per_op": per_op(seconds, left)}


def celery_live(stack: Stack, pool: str, conns: int, warmup: float, duration: float) -> dict[str, Any]:
    """Flower's submit while the Celery worker (``pool``) consumes, then result and info reads of the finished
    tasks with the worker running (idle once it has drained the submits)."""
    conn = stack.client()
    conn.flushall()
    flower, port = stack.start_flower()
    try:
        worker = stack.start_celery_worker(pool)
        try:
            groups = stack.cpu_groups(flower=flower, worker=worker)
            out = {"submit_live": with_cpu(groups, lambda: loadgen(port, "flower-submit", conns=conns, warmup=warmup,
                                                                   duration=duration, env=stack.environ()),
                                           requests_sent)}
            wait_drained(conn)
            ids = celery_ids(conn)
            wait_flower_knows(port, ids)
            reads = _reads(stack, port, ("flower-status", "flower-info"), ids, conns, min(warmup, 1.0), duration,
                           groups)
            out["status_live"], out["info_live"] = reads["flower-status"], reads["flower-info"]
        finally:
            stack.stop(worker)
    finally:
        stack.stop(flower)
        conn.flushall()
        conn.close()
    return out


def celery_e2e(stack: Stack, conns: int, tasks: int, pool: str = "prefork") -> dict[str, Any]:
    """One end-to-end run of Celery + Flower (fresh processes, Redis flushed before and after). ``stored``: the
    same run timed to the last task's ``date_done`` in the result backend instead of the last one seen done."""
    conn = stack.client()
    conn.flushall()
    flower, port = stack.start_flower()
    try:
        worker = stack.start_celery_worker(pool)
        try:
            result = e2e(stack, port, CELERY_E2E_PEER, tasks, conns, stack.cpu_groups(flower=flower, worker=worker))
            result["pool"] = pool
        finally:
            stack.stop(worker)
        succeeded, last = celery_completed(conn)
        result["stored"] = stored(result, succeeded, last)
        return result
    finally:
        stack.stop(flower)
        conn.flushall()
        conn.close()


def stored(run: dict[str, Any], completed: int, last_completed_epoch: float) -> dict[str, Any]:
    """An end-to-end run timed from its first request to its last task COMPLETED as the server recorded it."""
    seconds = last_completed_epoch - float(run["started_epoch"]) if last_completed_epoch else 0.0
    return {**run, "done": completed, "seconds": round(seconds, 3), "last_completed_epoch": last_completed_epoch,
            "tasks_per_s": round(completed / seconds, 1) if seconds > 0 else 0.0,
            "seen_tasks_per_s": run["tasks_per_s"], "seen_seconds": run["seconds"]}


def celery_round(stack: Stack, pool: str, conns: int, warmup: float, duration: float, tasks: int,
                 large: int) -> dict[str, Any]:
    """One round of the peer in one worker configuration: the live rows, then the two end-to-end runs."""
    out = celery_live(stack, pool, conns, warmup, duration)
    out["e2e"] = celery_e2e(stack, conns, tasks, pool)
    out["e2e_large"] = celery_e2e(stack, conns, large, pool)
    out["e2e_large_stored"] = out["e2e_large"].pop("stored")
    out["e2e"].pop("stored")
    return out


def best_e2e(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of alternating end-to-end rounds (see "Rounds" in bench/README.md), with every round's figure."""
    return {**max(runs, key=lambda r: float(r["tasks_per_s"])), "rounds": [r["tasks_per_s"] for r in runs]}


def taskport_e2e(stack: Stack, conns: int, tasks: int, batch: int = 0) -> dict[str, Any]:
    """One end-to-end run of taskport (fresh web and workers). With ``batch``: the tasks go as batches of that
    many, and ``tasks_per_s`` is timed to the last ``completed_at`` of the batch documents."""
    conn = stack.client()
    conn.flushall()
    web = stack.start_web()
    workers = stack.start_workers(stack.config.worker_class, stack.config.workers)
    try:
        result = e2e(stack, stack.config.port, "taskport", tasks, conns, stack.cpu_groups(web=web, workers=workers),
                     batch)
        result["worker_class"] = stack.config.worker_class
        result["workers"] = stack.config.workers
    finally:
        stack.stop(*workers)
        conn.flushall()
        conn.close()
    if batch:
        result = stored(result, result["done"], result["last_completed_epoch"])
    return result


def taskport_live(stack: Stack, conns: int, warmup: float, duration: float) -> dict[str, Any]:
    """taskport's submit, status, batch status and batch submit with its workers running (as under ``taskport
    up``): the submits are consumed as they come; each read follows once the workers have drained, and reads
    finished tasks (or DONE batches) with the workers still running."""
    conn = stack.client()
    conn.flushall()
    env = stack.environ()
    web = stack.start_web()
    port = stack.config.port
    workers = stack.start_workers(stack.config.worker_class, stack.config.workers)
    groups = stack.cpu_groups(web=web, workers=workers)
    out: dict[str, Any] = {}
    try:
        out["submit_live"] = with_cpu(groups, lambda: loadgen(port, "submit", conns=conns, warmup=warmup,
                                                              duration=duration, env=env), requests_sent)
        taskport_drained(conn)
        ids = history_ids(conn)
        out["status_live"] = _reads(stack, port, ("status",), ids, conns, min(warmup, 1.0), duration,
                                    groups)["status"]
        files = status_batches(stack, BATCH_BASE)
        taskport_drained(conn)
        for size, path in files.items():
            out[f"batch_status_{size}_live"] = loadgen(port, "batch-status", conns=conns, warmup=min(warmup, 1.0),
                                                       duration=duration, ids_file=str(path), env=env)
        out["batch_submit_live"] = loadgen(port, "batch-submit", conns=BATCH_CONNS, warmup=min(warmup, 1.0),
                                           duration=batch_window(duration), base=2 * BATCH_BASE, env=env,
                                           size=BATCH_SIZE)
    finally:
        stack.stop(*workers)  # the batch window's backlog is left undone: flushed
        conn.flushall()
        conn.close()
    return out


def taskport_round(stack: Stack, conns: int, warmup: float, duration: float, tasks: int, large: int) -> dict[str, Any]:
    """One round of taskport: the live rows, then the end-to-end runs (2,000 and 20,000 single submits, 20,000
    as batches)."""
    out = taskport_live(stack, conns, warmup, duration)
    out["e2e"] = taskport_e2e(stack, conns, tasks)
    out["e2e_large"] = taskport_e2e(stack, conns, large)
    out["batch_e2e"] = taskport_e2e(stack, BATCH_CONNS, large, batch=BATCH_SIZE)
    return out


def best_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the best of the rounds (each side's best, as everywhere in the bench)."""
    out = {}
    for name in rounds[0]:
        runs = [r[name] for r in rounds]
        if "batch_size" in runs[0]:
            out[name] = best_batches(runs)
        elif "tasks_per_s" in runs[0]:
            out[name] = best_e2e(runs)
        else:
            out[name] = best(runs)
        cpu = least_cpu(runs)
        if cpu is not None:
            out[name]["least_cpu_ms_per_op"] = cpu
    return out


def best_pool(pools: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The peer at its best: per figure, the faster worker configuration's (named in ``pool``)."""
    out = {}
    for name in next(iter(pools.values())):
        def rate(pool: str, figure: str = name) -> float:
            found = pools[pool][figure]
            return float(found["tasks_per_s"] if "tasks_per_s" in found else found["rps"])

        top = max(pools, key=rate)
        out[name] = {**pools[top][name], "pool": top, "pools": {p: rate(p) for p in pools}}
    return out


def peer_rounds(stack: Stack, conns: int, warmup: float, duration: float, rounds: int, tasks: int, large: int,
                phase: Any, runs: dict[str, Any]) -> dict[str, Any]:
    """Alternating rounds: each Celery configuration, then taskport, ``rounds`` times; each side's best. Every
    round's figures go into ``runs`` as soon as it ends (``celery``: per pool, ``taskport``)."""
    celery: dict[str, list[dict[str, Any]]] = runs.setdefault("celery", {pool: [] for pool in CELERY_POOLS})
    ours: list[dict[str, Any]] = runs.setdefault("taskport", [])
    for i in range(rounds):
        first = warmup if i == 0 else min(warmup, 1.0)
        for pool in CELERY_POOLS:
            celery[pool].append(phase(f"Celery + Flower ({pool}), round {i + 1}: live submit and status, end to end",
                                      lambda p=pool, w=first: celery_round(stack, p, conns, w, duration, tasks, large)))
        ours.append(phase(f"taskport, round {i + 1}: live submit, status and batches, end to end",
                          lambda w=first: taskport_round(stack, conns, w, duration, tasks, large)))
    pools = {pool: best_rounds(runs) for pool, runs in celery.items()}
    return {"celery_pools": pools, "celery_best": best_pool(pools), "taskport": best_rounds(ours)}


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
