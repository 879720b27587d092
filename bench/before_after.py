"""Before and after (issue 32), in the same run: CPU per submit, per status read and per delivery, per process.

The before side is a fixed commit (:data:`BEFORE`, the commit before issue 32's changes; ``--before REV``)
unpacked with ``git archive``; its processes are started by the same ``bench.stack.Stack`` with the tree as
their working directory and ``PYTHONPATH`` (``Stack.tree``), so they run its ``app``, ``workers`` and
``bench.apps``, and its gunicorn argv is its own ``web_command``'s; the redis-server, the load generator and
this measuring code are the same for both. The sides alternate (before, after, before, after...), so other
work on the machine falls on both alike.

One cycle of a side, every process fresh and Redis flushed: gunicorn and ``TASKPORT_WORKERS`` workers of the
default class start; the workers are stopped with SIGSTOP (registered, so a submit takes its usual path) for
a submit window (web and Redis CPU per submit) and a status window reading the tasks it queued (web and Redis
CPU per read); then SIGCONT, and the drain of that backlog, until no task is unfinished (``keys.ACTIVE``), is
the delivery: workers' and Redis's CPU and Redis's commands over the tasks drained. CPU per operation does
not depend on how the processes share the cores, so short windows do (:data:`WINDOW`).
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.core import keys
from bench.counting import command_delta, commandstats
from bench.measure_http import history_ids, loadgen, with_commands
from bench.measure_peers import taskport_drained
from bench.process_cpu import TOTAL, measured, per_op, with_cpu
from bench.stack import REPO, Proc, Stack
from bench.trees import archive

BEFORE = "139e736"  # main before issue 32's changes
WINDOW = 3.0  # seconds per submit and status window (at most; --quick's are shorter)
SIDES = ("before", "after")
OPS = ("submit", "status", "delivery")


def signal_all(procs: list[Proc], sig: signal.Signals) -> None:
    for proc in procs:
        os.killpg(proc.pid, sig)  # each leads its own session: a work horse too


def cycle(stack: Stack, conns: int, warmup: float, window: float) -> dict[str, Any]:
    """One side's submit, status and delivery figures (see the module's docstring)."""
    conn = stack.client()
    conn.flushall()
    env, port = stack.environ(), stack.config.port
    web = stack.start_web()
    workers = stack.start_workers(stack.config.worker_class, stack.config.workers)
    out: dict[str, Any] = {}
    requests_sent: Callable[[dict[str, Any]], int] = lambda found: int(found["submitted_total"])  # noqa: E731
    try:
        signal_all(workers, signal.SIGSTOP)
        front = stack.cpu_groups(web=web)
        out["submit"] = with_cpu(front, lambda: with_commands(conn, lambda: loadgen(
            port, "submit", conns=conns, warmup=warmup, duration=window, env=env)), requests_sent)
        ids = history_ids(conn)
        ids_file = stack.dir / "before-after-ids.txt"
        ids_file.write_text("\n".join(ids))
        out["status"] = with_cpu(front, lambda: with_commands(conn, lambda: loadgen(
            port, "status", conns=conns, warmup=warmup, duration=window, ids_file=str(ids_file), env=env)),
            requests_sent)
        queued = int(conn.zcard(keys.history("public")))  # every task of the cycle, all PENDING

        def drain() -> None:
            signal_all(workers, signal.SIGCONT)
            taskport_drained(conn)

        before = commandstats(conn)
        _, seconds = measured(stack.cpu_groups(workers=workers), drain)
        delta = command_delta(before, commandstats(conn))
        out["delivery"] = {"tasks": queued, "cpu_ms_per_op": per_op(seconds, queued),
                           "commands_per_delivery": round(sum(delta.values()) / max(queued, 1), 2)}
    finally:
        signal_all([w for w in workers if w.alive], signal.SIGCONT)
        stack.stop(*workers, web)
        conn.flushall()
        conn.close()
    return out


def measure(stack: Stack, rounds: int, conns: int, warmup: float, duration: float,
            rev: str = BEFORE) -> dict[str, Any]:
    """``rounds`` alternating cycles of the tree at ``rev`` and of this checkout; per side and operation, every
    round's figures and the least CPU of the rounds (other work on the machine only ever adds to it)."""
    work = Path(tempfile.mkdtemp(prefix="taskport-before-"))
    window = min(duration, WINDOW)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
    try:
        trees = {"before": work / "tree", "after": REPO}
        commit = archive(rev, trees["before"])
        for i in range(rounds):
            for side in SIDES:
                stack.tree = trees[side]
                try:
                    runs[side].append(cycle(stack, conns, warmup if i == 0 else min(warmup, 1.0), window))
                finally:
                    stack.tree = REPO
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"before_commit": commit, "rounds": runs, **{side: least(runs[side]) for side in SIDES}}


def least(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per operation, the round with the least CPU summed over its processes, every round's sum beside it."""
    out = {}
    for op in OPS:
        found = [r[op] for r in runs]
        top = dict(min(found, key=lambda r: float(r["cpu_ms_per_op"][TOTAL])))
        top["rounds_cpu_ms"] = [r["cpu_ms_per_op"][TOTAL] for r in found]
        top["median_cpu_ms"] = statistics.median(top["rounds_cpu_ms"])
        out[op] = top
    return out
